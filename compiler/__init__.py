"""fastpath.compiler"""
