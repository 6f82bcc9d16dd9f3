"""Fuzz harnesses for the sans-IO live-ASR protocol (``talkies.protocol``); see README.md."""
