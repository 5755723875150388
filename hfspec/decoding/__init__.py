"""Between a request and its tokens: the speculative decoding loop and everything it decides with.

The decode path, top to bottom, in five files:

    request.py   one generate call, checked once: target, draft or plain, γ, seed, hooks (`Request`)
    loop.py      `decode`: each round the job's verifier proposes and verifies, then the rows commit and settle
    round.py     the typed round objects the loop passes along: `Proposal`, `Verdict`, `Committed`
    scoring.py   logits to p and q, with the processing `generate` would apply
    sampling.py  the acceptance rule (Leviathan et al. 2023, Algorithm 1) as pure functions on tensors

Around it: stopping.py (when a row stops), gamma.py and early_exit.py (how many tokens to propose: the
`GammaPolicy` protocol), coupling.py (rejection or Gumbel coupling), options.py (generate options refused by
name), the verifiers (verifier.py: the `Verifier` protocol and the `RoundState` it reads; chain.py: the chain, the
default; siblings.py: sibling leaves; trees.py: token trees), and what a run records (stats.py: `SpecStats`;
costrecord.py: each round's measured costs; costmodel.py: the cost model the γ policy and the predictions use).

decoding imports drafts (the `Draft` protocol) and kernels (the models' runners), never measure, io, audit or
the front ends; `hfspec.api` is its door.
"""
