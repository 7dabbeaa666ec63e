"""Train a tiny Qwen/Llama-3-style byte-level BPE tokenizer.json fully offline.
Usage: python make_tiny_tokenizer.py OUT_DIR [VOCAB_SIZE]"""
import json, os, sys
from tokenizers import Tokenizer, Regex, decoders, models, pre_tokenizers, trainers

out_dir = sys.argv[1] if len(sys.argv) > 1 else "."
vocab_size = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
os.makedirs(out_dir, exist_ok=True)

# Qwen2 pre-tokenizer regex (cl100k family with \p{N} single digits); Llama-3 uses \p{N}{1,3}.
PAT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
       r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
tok.pre_tokenizer = pre_tokenizers.Sequence([
    pre_tokenizers.Split(Regex(PAT), behavior="isolated", invert=False),
    pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
])
tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)

# Deterministic synthetic corpus: no download needed.
words = ("the quick brown fox jumps over the lazy dog hello world router engine cache "
         "prefix block token request reply publish subscribe tokenizer llama qwen chat "
         "system user assistant 0123456789 , . ! ? : ; ( ) [ ] { } \" ' - _ / \\ \n").split(" ")
corpus = []
for i in range(5000):
    corpus.append(" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(12)) + f" {i}\n")
corpus.append("Ünïcödé ✓ 日本語 中文 emoji 🙂 tabs\tand\r\nCRLF")

trainer = trainers.BpeTrainer(
    vocab_size=vocab_size, min_frequency=2, special_tokens=SPECIAL,
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
tok.train_from_iterator(corpus, trainer=trainer)
tok.save(os.path.join(out_dir, "tokenizer.json"))

# Minimal HF-style tokenizer_config.json with a ChatML (Qwen-style) Jinja chat template.
chat_template = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
json.dump({"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
           "chat_template": chat_template, "model_max_length": 32768,
           "tokenizer_class": "Qwen2Tokenizer"},
          open(os.path.join(out_dir, "tokenizer_config.json"), "w"), indent=2)

t = Tokenizer.from_file(os.path.join(out_dir, "tokenizer.json"))
for s in ["hello world 12345", "<|im_start|>user\nhi<|im_end|>", "日本語 🙂"]:
    e = t.encode(s, add_special_tokens=False)
    assert t.decode(e.ids, skip_special_tokens=False) == s, (s, t.decode(e.ids))
    print(repr(s), e.ids)
print("vocab", t.get_vocab_size(), "bytes", os.path.getsize(os.path.join(out_dir, "tokenizer.json")))
