"""Markdown tables as tests read them: the padding that aligns columns taken out."""

import re


def squeeze(md: str) -> str:
    """'| a    | bb |' -> '| a | bb |'"""
    return re.sub(r" {2,}\|", " |", md)
