"""A Hugging Face causal LM (``models.causal_lm.CausalLM``) as a chain of pipeline blocks, as
``gpt_blocks`` cuts the bundled GPT: the embedding, each decoder layer, then the final norm and
the output head. Every block takes one tensor and returns one (token ids, then hidden states,
then logits), so any cut of the list into stages runs under any schedule.

What the model's own forward computes once for all layers, each ``DecoderLayer`` computes for
itself from its input: the positions (0..seq-1: the trainer packs whole windows, nothing padded),
the causal mask the config's attention implementation wants (``create_causal_mask``), and for
the Llama family the rotary embedding (``rotary``, the model's module, shared by the layers).

GPT-2's head is tied to its token embedding: the last block gets its own copy of the weight and
``tied`` names the pair (in the first and the last block) whose gradients the Pipeline sums."""

from __future__ import annotations

import torch
from torch import nn

from . import Head

# model_type -> the family whose module names and layer interface the blocks rely on
FAMILIES = {"gpt2": "gpt2", "llama": "llama"}


class GPT2Embedding(nn.Module):
    """GPT-2's first block: token plus position embeddings, then its embedding dropout."""

    def __init__(self, wte: nn.Embedding, wpe: nn.Embedding, drop: nn.Module):
        super().__init__()
        self.wte, self.wpe, self.drop = wte, wpe, drop

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        return self.drop(self.wte(tokens) + self.wpe(positions))


class TokenEmbedding(nn.Module):
    """The Llama family's first block: the token embedding."""

    def __init__(self, embed_tokens: nn.Embedding):
        super().__init__()
        self.embed_tokens = embed_tokens

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(tokens)


class DecoderLayer(nn.Module):
    """One decoder layer called as its model calls it, with the ``positions``, causal ``mask``
    and (``rotary`` given) position embeddings of its input's sequence length."""

    def __init__(self, layer: nn.Module, config, rotary: nn.Module | None = None):
        super().__init__()
        self.layer, self.rotary = layer, rotary
        self._config = config  # not a module: kept out of the state dict

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        from transformers.masking_utils import create_causal_mask

        positions = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
        mask = create_causal_mask(
            config=self._config,
            inputs_embeds=hidden,
            attention_mask=None,
            cache=None,
            position_ids=positions,
        )
        extra = {}
        if self.rotary is not None:
            extra["position_embeddings"] = self.rotary(hidden, position_ids=positions)
        out = self.layer(
            hidden, attention_mask=mask, position_ids=positions, use_cache=False, **extra
        )
        return out[0] if isinstance(out, tuple) else out


def family(config) -> str | None:
    return FAMILIES.get(getattr(config, "model_type", None))


def causal_lm_blocks(model) -> tuple[list[nn.Module], tuple[str, str] | None]:
    """``model`` (a CausalLM around a GPT-2 or Llama-family model) as blocks, and the tied
    (first block, last block) parameter names or None; see the module docstring."""
    config, inner = model.config, model.inner
    kind = family(config)
    if kind == "gpt2":
        base = inner.transformer
        first, embed = GPT2Embedding(base.wte, base.wpe, base.drop), base.wte
        layers = [DecoderLayer(b, config) for b in base.h]
        norm, name = base.ln_f, "wte.weight"
    elif kind == "llama":
        base = inner.model
        first, embed = TokenEmbedding(base.embed_tokens), base.embed_tokens
        layers = [DecoderLayer(b, config, base.rotary_emb) for b in base.layers]
        norm, name = base.norm, "embed_tokens.weight"
    else:
        raise ValueError(
            f"the pipeline split has no blocks for model_type "
            f"{getattr(config, 'model_type', None)!r}; it covers {', '.join(sorted(FAMILIES))}"
        )
    tied = inner.lm_head.weight is embed.weight
    last = Head(norm, inner.lm_head, copy=tied)
    return [first, *layers, last], ((name, "head.weight") if tied else None)
