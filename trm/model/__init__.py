"""trm.model"""
