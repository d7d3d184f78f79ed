"""Writes bpe400/tokenizer.json: a byte-level BPE tokenizer (GPT-2's kind: ByteLevel
pre-tokenizer and decoder, <|endoftext|> as its only special token) with a 400-token vocabulary,
trained with Hugging Face ``tokenizers`` on the first 200,000 characters of shardwise's bundled
corpus. The tests read the committed file, as a user's tokenizer.json would be read; run this
only to regenerate it: ``python tests/data/tokenizers/make_bpe400.py``."""

from pathlib import Path

from shardwise.train.data import load_corpus
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(
    vocab_size=400,
    special_tokens=["<|endoftext|>"],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
)
tok.train_from_iterator([load_corpus()[:200_000]], trainer)
out = Path(__file__).parent / "bpe400" / "tokenizer.json"
out.parent.mkdir(exist_ok=True)
tok.save(str(out))
print(f"wrote {out} ({tok.get_vocab_size()} tokens)")
