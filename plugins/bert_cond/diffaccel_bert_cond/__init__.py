"""diffaccel strategy ``bert-cond``: two-stage BERT conditioning, so key terms of a source survive
text diffusion.

    [[strategy]]
    use = "bert-cond"
    source = "The fine is $5,000, payable to the City of Boston."
    max_terms = 5

Stage one: a pretrained BERT (MiniLM by default) extracts the source's key terms (candidate
phrases scored by similarity to the source, maximal marginal relevance, numbers and names always
candidates). Stage two: their tokens are pinned at planned positions of the generated text.
"""

from __future__ import annotations

__version__ = "0.1.0"

from diffaccel import Strategy, hookimpl
from diffaccel.contract.capabilities import PINNED_TOKENS, TOKEN_LOGITS

from .candidates import Candidate, always_candidates, candidates
from .config import MINILM, BertCondConfig
from .extract import BERT_FAMILY, Condition, Encoder, extract, mmr
from .metrics import present, presence, recall
from .plan import TermsDoNotFit, pin_row, spread, term_token_ids, word_continuations
from .strategy import BertCond


@hookimpl
def diffaccel_register(register):
    register(Strategy(name="bert-cond", config=BertCondConfig, factory=BertCond, requires=(TOKEN_LOGITS, PINNED_TOKENS),
                      reports=("key_term_recall", "stage_one_share", "placement_share"),
                      description="two-stage BERT conditioning: key terms of a source extracted by a BERT, pinned in the generated text"))


@hookimpl
def diffaccel_register_commands(commands):
    """``diffaccel bert-cond-conditions`` (``conditions.py``): the training lines' conditions."""
    from . import conditions

    conditions.register(commands)


__all__ = ["BERT_FAMILY", "MINILM", "BertCond", "BertCondConfig", "Candidate", "Condition", "Encoder", "TermsDoNotFit",
           "__version__", "always_candidates", "candidates", "diffaccel_register", "diffaccel_register_commands", "extract", "mmr",
           "pin_row", "present", "presence", "recall", "spread", "term_token_ids", "word_continuations"]
