"""trm.analysis"""
