"""trm.data"""
