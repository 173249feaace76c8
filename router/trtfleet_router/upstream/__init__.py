"""Upstream side of the router: channels to pods, the dispatcher, text generation, load scraping."""
