"""trm.train"""
