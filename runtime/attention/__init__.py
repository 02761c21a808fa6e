"""Attention (FMHA) libraries behind one interface, tried in the manifest's order by FmhaManager:
torch SDPA's backends, FlexAttention, FlashInfer, a Triton decode kernel, and a plain reference."""
