"""The official `openai` SDK against running Shoal replicas.

  python test_openai.py URL [URL...]    (each URL is a replica, http://host:port)

Every check runs on every replica: chat non-stream and stream, completions
non-stream and stream, /v1/models, responses (non-stream and
stream) and embeddings. Content must be non-empty and `usage`
present and consistent (stream usage via stream_options.include_usage).
Ends with "openai: N passed, N failed"; exit 1 on any failure.
"""
import os
import sys
import traceback

import openai

MAX_TOKENS = 12
MESSAGES = [{"role": "user", "content": "Say hello to the shoal of routers, please."}]
PROMPT = "Once upon a time, a router"


def check_usage(usage, where):
    assert usage is not None, f"{where}: no usage"
    assert usage.prompt_tokens > 0, f"{where}: prompt_tokens {usage.prompt_tokens}"
    assert 0 < usage.completion_tokens <= MAX_TOKENS, f"{where}: completion_tokens {usage.completion_tokens}"
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens, f"{where}: total {usage}"


def check_finish(reason, usage, where):
    assert reason in ("stop", "length"), f"{where}: finish_reason {reason!r}"
    if reason == "length":
        assert usage.completion_tokens == MAX_TOKENS, f"{where}: length but {usage.completion_tokens} tokens"


def read_stream(stream, text_of, where):
    """Returns (text, finish_reason, usage, content chunk count)."""
    parts, finish, usage, chunks = [], None, None, 0
    for chunk in stream:
        if chunk.usage is not None:
            assert usage is None, f"{where}: usage sent twice"
            usage = chunk.usage
        for choice in chunk.choices:
            text = text_of(choice)
            if text:
                parts.append(text)
                chunks += 1
            finish = choice.finish_reason or finish
    return "".join(parts), finish, usage, chunks


def chat(client, model):
    r = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=MAX_TOKENS)
    assert r.object == "chat.completion", r.object
    assert r.choices and r.choices[0].message.content, "chat: empty content"
    check_usage(r.usage, "chat")
    check_finish(r.choices[0].finish_reason, r.usage, "chat")
    return r.usage.prompt_tokens


def chat_stream(client, model, prompt_tokens):
    stream = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=MAX_TOKENS, stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage, chunks = read_stream(stream, lambda c: c.delta.content, "chat stream")
    assert text, "chat stream: empty content"
    check_usage(usage, "chat stream")
    check_finish(finish, usage, "chat stream")
    assert chunks <= usage.completion_tokens, f"chat stream: {chunks} chunks > {usage.completion_tokens} tokens"
    # Same messages, same engine tokenizer: same prompt size either way.
    assert usage.prompt_tokens == prompt_tokens, f"chat stream: prompt {usage.prompt_tokens} != {prompt_tokens}"


def completions(client, model):
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=MAX_TOKENS)
    assert r.object == "text_completion", r.object
    assert r.choices and r.choices[0].text, "completions: empty text"
    check_usage(r.usage, "completions")
    check_finish(r.choices[0].finish_reason, r.usage, "completions")
    return r.usage.prompt_tokens


def completions_stream(client, model, prompt_tokens):
    stream = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=MAX_TOKENS, stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage, chunks = read_stream(stream, lambda c: c.text, "completions stream")
    assert text, "completions stream: empty text"
    check_usage(usage, "completions stream")
    check_finish(finish, usage, "completions stream")
    assert chunks <= usage.completion_tokens, f"completions stream: {chunks} chunks"
    assert usage.prompt_tokens == prompt_tokens, f"completions stream: prompt {usage.prompt_tokens} != {prompt_tokens}"


def responses(client, model):
    r = client.responses.create(model=model, input=PROMPT, max_output_tokens=MAX_TOKENS)
    assert r.object == "response", r.object
    assert r.status == "completed", r.status
    assert r.output_text, "responses: empty output_text"
    assert r.usage and r.usage.output_tokens > 0, f"responses: usage {r.usage}"


def responses_stream(client, model):
    deltas, completed = [], None
    events = client.responses.create(model=model, input=PROMPT, max_output_tokens=MAX_TOKENS, stream=True)
    for event in events:
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        elif event.type == "response.completed":
            completed = event.response
    assert deltas, "responses stream: no text deltas"
    assert completed is not None and completed.output_text == "".join(deltas), "responses stream: final text"


def embeddings(client, model):
    r = client.embeddings.create(model=model, input=["hello", "world"][:1])
    assert r.data and len(r.data[0].embedding) > 0, "embeddings: no vector"
    assert r.usage.prompt_tokens > 0, f"embeddings: usage {r.usage}"


def main(urls):
    passed = failed = 0
    for url in urls:
        # A replica with keys (a tenant's) needs one; the others ignore it.
        api_key = os.environ.get("SHOAL_TEST_API_KEY", "unused")
        client = openai.OpenAI(base_url=url + "/v1", api_key=api_key, timeout=30, max_retries=0)
        state = {}
        checks = [
            ("models", lambda: state.update(model=client.models.list().data[0].id)),
            ("chat", lambda: state.update(chat=chat(client, state["model"]))),
            ("chat stream", lambda: chat_stream(client, state["model"], state["chat"])),
            ("completions", lambda: state.update(comp=completions(client, state["model"]))),
            ("completions stream", lambda: completions_stream(client, state["model"], state["comp"])),
            ("responses", lambda: responses(client, state["model"])),
            ("responses stream", lambda: responses_stream(client, state["model"])),
            ("embeddings", lambda: embeddings(client, state["model"])),
        ]
        for name, check in checks:
            try:
                check()
                passed += 1
                print(f"ok   {url} {name}")
            except Exception:  # noqa: BLE001 - report every failure and go on
                failed += 1
                print(f"FAIL {url} {name}\n{traceback.format_exc()}")
    print(f"openai: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
