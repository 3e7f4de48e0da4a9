"""Seeing a dataset: the numbers (``stats``), the HTML/PNG page (``html``) and the card."""
