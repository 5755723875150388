"""Exactness checks a user runs: `hfspec audit` (`command`: greedy identity and a χ² test of sampled tokens
against plain decoding), its statistics (`chi2`), and what "exact" means per dtype (`exactness`)."""
