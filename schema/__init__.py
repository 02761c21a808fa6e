"""fastpath.schema"""
