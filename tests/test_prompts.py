"""bi_rl.rollout.prompts: one prompt set from any supported source, clear errors otherwise.

Properties: JSONL, JSON, CSV, Parquet and saved `datasets` directories (Dataset and
DatasetDict) give the same prompts; the chat template is applied exactly when the tokenizer
has one (or it is asked for), chat-message lists are supported; every bad input raises a
PromptError naming the file and the fix.
"""

import csv

import pytest
from mlx_lm.utils import load_tokenizer
from tiny_models import CHAT_TEMPLATE, save_char_tokenizer, write_jsonl

from bi_rl.rollout.prompts import PromptError, load_prompts, prompts_digest

ROWS = [
    {"id": "a", "prompt": "12+34=", "answer": "46"},
    {"id": "b", "prompt": "7+8=", "answer": "15"},
    {"id": "c", "prompt": "hello there", "answer": "-"},
]


@pytest.fixture(scope="module")
def toks(tmp_path_factory):
    root = tmp_path_factory.mktemp("tok")
    save_char_tokenizer(root / "plain")
    save_char_tokenizer(root / "chat", chat_template=CHAT_TEMPLATE)
    return load_tokenizer(root / "plain"), load_tokenizer(root / "chat")


def _sources(tmp_path):
    import datasets

    write_jsonl(tmp_path / "p.jsonl", ROWS)
    (tmp_path / "p.json").write_text(__import__("json").dumps(ROWS))
    with open(tmp_path / "p.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(ROWS[0]))
        w.writeheader()
        w.writerows(ROWS)
    ds = datasets.Dataset.from_list(ROWS)
    ds.to_parquet(str(tmp_path / "p.parquet"))
    ds.save_to_disk(str(tmp_path / "ds"))
    datasets.DatasetDict({"train": ds, "test": ds.select([0])}).save_to_disk(str(tmp_path / "dd"))
    return ["p.jsonl", "p.json", "p.csv", "p.parquet", "ds"]


def test_every_source_gives_the_same_prompts(tmp_path, toks):
    plain, _ = toks
    got = [load_prompts(tmp_path / s, plain) for s in _sources(tmp_path)]
    got.append(load_prompts(tmp_path / "dd", plain, split="train"))
    assert all(g == got[0] for g in got)
    assert [p.id for p in got[0]] == ["a", "b", "c"]
    assert got[0][0].tokens == tuple(plain.encode("12+34="))
    one = load_prompts(tmp_path / "dd", plain, split="test")
    assert [p.id for p in one] == ["a"]


def test_ids_default_to_row_index_and_fields_are_selectable(tmp_path, toks):
    plain, _ = toks
    write_jsonl(tmp_path / "q.jsonl", [{"q": "1+1="}, {"q": "2+2="}])
    ps = load_prompts(tmp_path / "q.jsonl", plain, field="q")
    assert [p.id for p in ps] == ["0", "1"]
    ps = load_prompts(tmp_path / "q.jsonl", plain, field="q", limit=1)
    assert len(ps) == 1


def test_chat_template_is_applied_when_present(tmp_path, toks):
    plain, chat = toks
    write_jsonl(tmp_path / "p.jsonl", ROWS)
    templated = load_prompts(tmp_path / "p.jsonl", chat)
    want = chat.apply_chat_template(
        [{"role": "user", "content": "12+34="}], add_generation_prompt=True
    )
    assert list(templated[0].tokens) == want
    assert templated[0].tokens[0] == chat.convert_tokens_to_ids("<|user|>")
    raw = load_prompts(tmp_path / "p.jsonl", chat, chat_template=False)
    assert raw[0].tokens == tuple(chat.encode("12+34="))
    write_jsonl(tmp_path / "m.jsonl", [{"prompt": [{"role": "user", "content": "12+34="}]}])
    assert load_prompts(tmp_path / "m.jsonl", chat)[0].tokens == templated[0].tokens
    with pytest.raises(PromptError, match="no chat template"):
        load_prompts(tmp_path / "p.jsonl", plain, chat_template=True)
    with pytest.raises(PromptError, match="list of chat messages"):
        load_prompts(tmp_path / "m.jsonl", plain)


def test_digest_covers_ids_and_tokens(tmp_path, toks):
    plain, chat = toks
    write_jsonl(tmp_path / "p.jsonl", ROWS)
    a = prompts_digest(load_prompts(tmp_path / "p.jsonl", plain))
    b = prompts_digest(load_prompts(tmp_path / "p.jsonl", chat))
    write_jsonl(tmp_path / "r.jsonl", [{**ROWS[0], "id": "z"}, *ROWS[1:]])
    c = prompts_digest(load_prompts(tmp_path / "r.jsonl", plain))
    assert len({a, b, c}) == 3


@pytest.mark.parametrize(
    "name,make,kwargs,match",
    [
        ("x.jsonl", lambda p: write_jsonl(p, []), {}, "empty"),
        ("x.jsonl", lambda p: write_jsonl(p, ROWS), {"field": "question"}, "no field 'question'"),
        ("x.jsonl", lambda p: write_jsonl(p, [ROWS[0], ROWS[0]]), {}, "duplicate prompt id 'a'"),
        ("x.jsonl", lambda p: write_jsonl(p, [ROWS[0], {"id": "z"}]), {}, "row 1 has no 'prompt'"),
        ("x.jsonl", lambda p: write_jsonl(p, [{"prompt": ""}]), {}, "encodes to no tokens"),
        ("x.jsonl", lambda p: write_jsonl(p, [{"prompt": 3}]), {}, "text or a list"),
        ("x.jsonl", lambda p: p.write_text('{"prompt": "a"}\n{oops\n'), {}, "jsonl:2: not valid"),
        ("x.txt", lambda p: p.write_text("hi"), {}, "unknown prompt file type"),
        ("x.parquet", lambda p: p.write_text("not parquet"), {}, "cannot read as Parquet"),
        ("x.json", lambda p: p.write_text('{"a": 1}'), {}, "JSON list"),
        ("x", lambda p: p.mkdir(), {}, "not a saved `datasets` directory"),
        ("missing.jsonl", lambda p: None, {}, "no such prompt file"),
    ],
)
def test_bad_prompt_sets_give_one_line_errors(tmp_path, toks, name, make, kwargs, match):
    plain, _ = toks
    path = tmp_path / name
    make(path)
    with pytest.raises(PromptError, match=match) as e:
        load_prompts(path, plain, **kwargs)
    assert "\n" not in str(e.value)


def test_dataset_dict_needs_a_split(tmp_path, toks):
    plain, _ = toks
    _sources(tmp_path)
    with pytest.raises(PromptError, match="choose one with --split"):
        load_prompts(tmp_path / "dd", plain)
    with pytest.raises(PromptError, match="no split 'dev'"):
        load_prompts(tmp_path / "dd", plain, split="dev")


def test_characters_the_tokenizer_drops_are_named_once(tmp_path, toks):
    """A tokenizer that maps unknown characters to nothing (or to a special token) changes
    the prompt silently; loading warns once, naming those characters, and changes no token."""
    import warnings

    from bi_rl.rollout.prompts import PromptWarning

    plain, _ = toks
    rows = [
        {"id": "a", "prompt": "12+34="},
        {"id": "b", "prompt": "héllo wörld 1+2="},
        {"id": "c", "prompt": "ÉÉ"},
    ]
    write_jsonl(tmp_path / "p.jsonl", rows)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prompts = load_prompts(tmp_path / "p.jsonl", plain)
    dropped = [w for w in caught if issubclass(w.category, PromptWarning)]
    assert len(dropped) == 1, [str(w.message) for w in caught]
    msg = str(dropped[0].message)
    assert "'É', 'é', 'ö'" in msg and "in 2 of 3 prompts, first 'b'" in msg, msg
    assert prompts[1].tokens == tuple(plain.encode(rows[1]["prompt"])), "tokens are unchanged"
    write_jsonl(tmp_path / "ok.jsonl", ROWS)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_prompts(tmp_path / "ok.jsonl", plain)
    assert not caught, "prompts the tokenizer keeps whole give no warning"
