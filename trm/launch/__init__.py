"""trm.launch"""
