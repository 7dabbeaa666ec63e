import re, sys, json, msgspec, msgpack
from typing import Any, Optional, Union
import enum
# Unpacked release wheels (`pip download --no-deps vllm==X sglang==Y`, then unzip into
# $WHEELS/v<version>/ and $WHEELS/sgl<version>/).
import os
W = os.environ.get("WHEELS", "wheels")

def load_structs(path):
    src = open(path).read()
    start = src.index("class EventBatch(")
    m = re.search(r"class KVEventBatch\(EventBatch\):\n(?:    #[^\n]*\n)*    events: [^\n]+\n", src)
    body = src[start:m.end()]
    ns = {"msgspec": msgspec, "Any": Any, "Optional": Optional, "Union": Union,
          "ExternalBlockHash": Union[bytes, int], "enum": enum, "hashlib": __import__("hashlib")}
    exec(body, ns)
    return ns

def show(label, obj, enc):
    b = enc.encode(obj)
    dec = msgpack.unpackb(b, raw=False, strict_map_key=False)
    print(f"### {label}")
    print("decoded:", repr(dec))
    print("hex    :", b.hex())
    print()

enc = msgspec.msgpack.Encoder()
H1 = 0x1122334455667788          # < 2^63
H2 = 0xF1E2D3C4B5A69788          # > 2^63 (u64 only)
HB = bytes(range(32))            # 32-byte sha256-like digest

def vllm(ver):
    ns = load_structs(f"{W}/v{ver}/vllm/distributed/kv_events.py")
    BS, BR, AC, B = ns["BlockStored"], ns["BlockRemoved"], ns["AllBlocksCleared"], ns["KVEventBatch"]
    f = BS.__struct_fields__
    kw = dict(block_hashes=[H1, H2], parent_block_hash=None, token_ids=[1,2,3,4], block_size=4, lora_id=None)
    if "medium" in f: kw["medium"] = "GPU"
    if "lora_name" in f: kw["lora_name"] = None
    stored = BS(**kw)
    rkw = dict(block_hashes=[H2])
    if "medium" in BR.__struct_fields__: rkw["medium"] = "GPU"
    removed = BR(**rkw)
    bkw = dict(ts=1.5, events=[stored, removed, AC()])
    if "data_parallel_rank" in B.__struct_fields__: bkw["data_parallel_rank"] = 0
    print(f"## vLLM {ver}: BlockStored fields={f}; BlockRemoved fields={BR.__struct_fields__}; batch fields={B.__struct_fields__}")
    show(f"vllm {ver} batch (store+remove+clear), dp_rank=0", B(**bkw), enc)
    # full-featured store
    if "extra_keys" in f:
        kw2 = dict(kw, parent_block_hash=H1, block_hashes=[H2], lora_id=7, lora_name="my-lora",
                   extra_keys=[("my-lora", ("mmhash", 0), "salt")])
        if "group_idx" in f: kw2["group_idx"] = 1
        if "kv_cache_spec_kind" in f: kw2["kv_cache_spec_kind"] = "sliding_window"; kw2["kv_cache_spec_sliding_window"] = 4096
        if "session_id" in f: kw2["session_id"] = "sess-1"
        if "lookahead_token_ids" in f: kw2["lookahead_token_ids"] = [[5, 6]]
        show(f"vllm {ver} BlockStored with optional fields set", BS(**kw2), enc)
    if "data_parallel_rank" in B.__struct_fields__:
        show(f"vllm {ver} batch dp_rank=None omitted(only if omit_defaults)", B(ts=1.5, events=[AC()]), enc)
    # bytes hash variant (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0)
    if "medium" in f:
        kwb = dict(kw, block_hashes=[HB])
        show(f"vllm {ver} BlockStored with bytes hashes", BS(**kwb), enc)

def sgl(ver):
    ns = load_structs(f"{W}/sgl{ver}/sglang/srt/disaggregation/kv_events.py")
    BS, BR, AC, B = ns["BlockStored"], ns["BlockRemoved"], ns["AllBlocksCleared"], ns["KVEventBatch"]
    f = BS.__struct_fields__
    print(f"## SGLang {ver}: BlockStored fields={f}; BlockRemoved fields={BR.__struct_fields__}; batch fields={B.__struct_fields__}")
    kw = dict(block_hashes=[-1234567890123456789], parent_block_hash=None, token_ids=[1,2,3,4], block_size=4, lora_id=None)
    if "medium" in f: kw["medium"] = "GPU"
    stored = BS(**kw)
    rkw = dict(block_hashes=[-1234567890123456789])
    if "medium" in BR.__struct_fields__: rkw["medium"] = "GPU"
    show(f"sglang {ver} batch attn_dp_rank=0", B(ts=1.5, events=[stored, BR(**rkw), AC()], attn_dp_rank=0), enc)
    show(f"sglang {ver} batch attn_dp_rank=None", B(ts=1.5, events=[AC()]), enc)
    if "BlockStoredWithMetadata" in ns:
        s = ns["BlockStoredWithMetadata"](**kw, metadata=ns["BlockStoredMetadata"](cache_salt="tenant-a"))
        show(f"sglang {ver} BlockStoredWithMetadata", s, enc)
    if "cache_salt" in f:
        kw2 = dict(kw, cache_salt="tenant-a", session_id="s1")
        if "lora_name" in f: kw2["lora_name"] = "my-lora"
        show(f"sglang {ver} BlockStored with salt/session/lora_name", BS(**kw2), enc)
    if "medium" in f:
        show(f"sglang {ver} BlockStored medium omitted (None)", BS(**dict(kw, medium=None)), enc)

for v in sys.argv[1].split(","):
    vllm(v)
for v in sys.argv[2].split(","):
    sgl(v)
