"""Damaged and mismatched inputs are one line, not a traceback: index files
(no meta.json, a truncated BM25 file, a truncated index.faiss or one of another index or
dimension), a retriever answer of the wrong shape, model files (truncated safetensors, a
config.json of another size, a tokenizer larger than the embedding), arguments (`serve --port
70000`, `search -k 0`, `eval report --out FILE`, negative `--limit` and `--steps`), the run
directory equal to model.path, an edited chat template on --resume, dev questions that are also
training questions (counted, said and recorded), and a BOM at the start of a question file."""

import json
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from mopd.cli import main
from tests.reliability.indexes import bm25_index, copy_index, flat_index, flat_vectors, truncate
from tests.helpers.cli import one_line_error


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MOPD_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def bm25(tmp_path_factory):
    return bm25_index(tmp_path_factory.mktemp("bm25"))


@pytest.fixture(scope="module")
def flat(tmp_path_factory):
    return flat_index(tmp_path_factory.mktemp("flat"))


@pytest.fixture()
def no_serving(monkeypatch):
    """`retriever serve` must refuse before serving: a server that starts fails the test (instead of
    running forever)."""
    import mopd.retriever.server as server

    monkeypatch.setattr(server, "serve", lambda *a, **k: pytest.fail("the server started"))




def _search(index, *extra):
    return ["retriever", "search", "--index", str(index), "band", *extra]


def _serve(index):
    return ["retriever", "serve", "--index", str(index), "--port", "0"]


def _train(model, qa_file, out, *extra):
    return ["train", "tiny_cmas_rl", f"model.path={model}", f"data.train={qa_file}", f"trainer.out_dir={out}", *extra]


def _eval(model, qa_file, out, *extra):
    return ["eval", "run", "--model", str(model), "--workflow", "cmas", "--manifest", qa_file, "--out", str(out),
            *extra]


# ---------------------------------------------------------------------------------------- indexes


def test_an_index_without_meta_json(bm25, tmp_path, capsys, no_serving, tiny_model_dir, qa_file):
    d = copy_index(bm25, tmp_path / "index")
    (d / "meta.json").unlink()
    for argv in (_search(d), _serve(d)):
        one_line_error(capsys, argv, f"{d} is not a finished index directory: no meta.json")
    one_line_error(capsys, _train(tiny_model_dir, qa_file, tmp_path / "run", f"retriever.index={d}"), "no meta.json")
    assert not (tmp_path / "run").exists()
    one_line_error(capsys, _eval(tiny_model_dir, qa_file, tmp_path / "ev", f"retriever.index={d}"), "no meta.json")


BM25_FILES = ["data.csc.index.npy", "indices.csc.index.npy", "indptr.csc.index.npy", "params.index.json",
              "vocab.index.json", "vocab.tokenizer.json"]


@pytest.mark.parametrize("name", BM25_FILES)
def test_a_truncated_bm25_file(bm25, tmp_path, capsys, name):
    d = copy_index(bm25, tmp_path / "index")
    truncate(d / "bm25" / name)
    one_line_error(capsys, _search(d), f"{d / 'bm25' / name}", "truncated or damaged")


def test_a_truncated_bm25_file_is_refused_before_training(bm25, tmp_path, capsys, tiny_model_dir, qa_file):
    d = copy_index(bm25, tmp_path / "index")
    truncate(d / "bm25" / "vocab.index.json")
    one_line_error(capsys, _train(tiny_model_dir, qa_file, tmp_path / "run", f"retriever.index={d}"),
              f"retriever.index={d}", "vocab.index.json")
    assert not (tmp_path / "run").exists()


def _truncated(d):
    truncate(d / "index.faiss")


def _other_corpus(d):       # the index.faiss of a 20-passage corpus
    import faiss

    faiss.write_index(flat_vectors(20, 384, seed=1), str(d / "index.faiss"))


def _same_size_other_vectors(d):
    import faiss

    faiss.write_index(flat_vectors(12, 384, seed=2), str(d / "index.faiss"))


def _other_dimension(d):
    import faiss

    faiss.write_index(flat_vectors(12, 8), str(d / "index.faiss"))


def _meta_of_another_dimension(d):
    meta = json.loads((d / "meta.json").read_text())
    meta["dim"] = 768
    (d / "meta.json").write_text(json.dumps(meta))


FAISS_CASES = [(_truncated, "the file is incomplete"), (_other_corpus, "holds 20 vectors of dimension 384"),
               (_same_size_other_vectors, "not the ones it was built with"),
               (_other_dimension, "holds 12 vectors of dimension 8"),
               (_meta_of_another_dimension, "encoder 'minilm' makes 384-dimensional vectors")]


@pytest.mark.parametrize("damage,message", FAISS_CASES, ids=[f.__name__.strip("_") for f, _ in FAISS_CASES])
def test_a_faiss_index_that_does_not_fit_its_meta_json(flat, tmp_path, capsys, no_serving, damage, message):
    """serve used to start on these and answer every request with 500."""
    d = copy_index(flat, tmp_path / "index")
    damage(d)
    one_line_error(capsys, _search(d), message)
    one_line_error(capsys, _serve(d), message)


def test_serve_refuses_an_index_that_cannot_answer(bm25, capsys, no_serving, monkeypatch):
    from mopd.retriever.index_bm25 import BM25Index

    def broken(self, queries, k):
        raise RuntimeError("index read failed")

    monkeypatch.setattr(BM25Index, "search", broken)
    one_line_error(capsys, _serve(bm25), f"{bm25} cannot answer a search (RuntimeError: index read failed)")


def test_the_intact_indexes_pass_the_checks(bm25, flat):
    from mopd.retriever import open_retriever
    from mopd.retriever.index_check import check_index
    from mopd.retriever.index_store import read_meta

    assert [p.title for p in open_retriever(bm25).search(["band 11"], 1)[0]] == ["Band 11"]
    check_index(read_meta(flat), flat)          # what opening it checks before its encoder loads


# --------------------------------------------------------------------------- retriever answers


ANSWERS = [{"result": [[1, 2]]}, {"result": [["Doc 1"]]}, {"result": [{"document": {"contents": "a\nb"}}]},
           {"result": [[{"document": "a\nb", "score": 1.0}]]},
           {"result": [[{"document": {"id": "1", "contents": 5}, "score": 1.0}]]},
           {"result": [[{"document": {"id": "1", "contents": "a\nb"}, "score": "high"}]]},
           {"result": [[{"id": "1"}]]}]


@pytest.fixture()
def answering():
    """A server whose /retrieve answers ``answering.body`` (any JSON)."""
    state = {"body": {}}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            data = json.dumps(state["body"]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield state, f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


@pytest.mark.parametrize("body", ANSWERS, ids=range(len(ANSWERS)))
def test_a_retriever_answer_of_the_wrong_shape(answering, capsys, body):
    from mopd.retriever import HttpRetriever, RetrieverUnavailable

    state, url = answering
    state["body"] = body
    with pytest.raises(RetrieverUnavailable, match="answered in a shape this client cannot read") as e:
        HttpRetriever(url, retries=0).search(["q"], 1)
    assert "\n" not in str(e.value)
    one_line_error(capsys, ["retriever", "search", "--url", url, "q"], "answered in a shape")


def test_a_retriever_answer_of_the_right_shapes_still_reads(answering):
    from mopd.retriever import HttpRetriever

    state, url = answering
    state["body"] = {"result": [[{"document": {"id": 7, "contents": "T\nbody"}, "score": 1}],
                                [{"id": "2", "title": "U", "text": "more"}]]}
    a, b = HttpRetriever(url, retries=0).search(["q", "r"], 1)
    assert (a[0].id, a[0].title, a[0].text, a[0].score) == ("7", "T", "body", 1.0)
    assert (b[0].title, b[0].text) == ("U", "more")


# ------------------------------------------------------------------------------------- models


@pytest.fixture()
def model(tiny_model_dir, tmp_path):
    d = tmp_path / "model"
    shutil.copytree(tiny_model_dir, d)
    return d


def _truncated_safetensors(d):
    truncate(d / "model.safetensors", 7)


def _config_of_another_size(d):
    conf = json.loads((d / "config.json").read_text())
    conf["intermediate_size"] *= 2
    (d / "config.json").write_text(json.dumps(conf))


def _config_of_another_vocabulary(d):
    conf = json.loads((d / "config.json").read_text())
    conf["vocab_size"] = 100
    (d / "config.json").write_text(json.dumps(conf))


def _tokenizer_larger_than_the_embedding(d):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(d)
    tok.add_tokens([f"<extra_{i}>" for i in range(50)])
    tok.save_pretrained(d)


MODEL_CASES = [(_truncated_safetensors, "model.safetensors is truncated"),
               (_config_of_another_size, "config.json does not match the weights: model.layers.0.mlp"),
               (_config_of_another_vocabulary, "config.json does not match the weights: model.embed_tokens.weight"),
               (_tokenizer_larger_than_the_embedding, "rows, so token ids")]


@pytest.mark.parametrize("damage,message", MODEL_CASES, ids=[f.__name__.strip("_") for f, _ in MODEL_CASES])
def test_model_files_that_do_not_load(model, tmp_path, capsys, qa_file, damage, message):
    damage(model)
    one_line_error(capsys, _eval(model, qa_file, tmp_path / "ev", "retriever.index=bundled"), message)
    assert not (tmp_path / "ev").exists()
    one_line_error(capsys, _train(model, qa_file, tmp_path / "run"), message)
    assert not (tmp_path / "run" / "run.json").exists()        # the corrected rerun is not refused


# ---------------------------------------------------------------------------------- arguments


@pytest.mark.parametrize("port", ["70000", "-1"])
def test_serve_on_a_port_that_is_not_one(bm25, capsys, no_serving, port):
    one_line_error(capsys, ["retriever", "serve", "--index", str(bm25), "--port", port], f"--port {port} is not a TCP port")


@pytest.mark.parametrize("k", ["0", "-2"])
def test_search_k_below_one(bm25, capsys, k):
    one_line_error(capsys, _search(bm25, "-k", k), f"-k {k}")
    one_line_error(capsys, ["retriever", "search", "--url", "http://127.0.0.1:9", "-k", k, "q"], f"-k {k}")


def test_eval_report_out_that_is_a_file(tmp_path, capsys):
    f = tmp_path / "report.md"
    f.write_text("mine\n")
    records = tmp_path / "records.jsonl"
    records.write_text("")
    one_line_error(capsys, ["eval", "report", str(records), "--out", str(f)], f"--out {f} is a file")
    assert f.read_text() == "mine\n"


def test_negative_limit_is_refused_before_anything_is_written(tiny_model_dir, qa_file, tmp_path, capsys):
    one_line_error(capsys, _eval(tiny_model_dir, qa_file, tmp_path / "ev", "--limit", "-3"), "--limit -3")
    assert not (tmp_path / "ev").exists()


def test_negative_steps_is_refused_before_anything_is_written(tiny_model_dir, qa_file, tmp_path, capsys):
    run = tmp_path / "run"
    one_line_error(capsys, ["train", "--steps", "-1", *_train(tiny_model_dir, qa_file, run)[1:]], "--steps -1")
    assert not run.exists()


# ------------------------------------------------------------------------------- run directory


def test_the_run_directory_cannot_be_the_model_directory(model, qa_file, capsys):
    before = sorted(p.name for p in model.iterdir())
    one_line_error(capsys, _train(model, qa_file, model), f"trainer.out_dir={model} is model.path")
    assert sorted(p.name for p in model.iterdir()) == before


def _started_run(model, qa_file, run):
    from mopd.config import resolve
    from mopd.train.run_dir import prepare_run_dir
    from tests.helpers.training import tiny_overrides

    cfg = resolve("tiny_cmas_rl", tiny_overrides(model, qa_file, run))
    prepare_run_dir(cfg, resume=False)


def test_an_edited_chat_template_is_a_changed_setting_on_resume(model, qa_file, tmp_path, capsys):
    run = tmp_path / "run"
    _started_run(model, qa_file, run)
    template = model / "chat_template.jinja"
    template.write_text(template.read_text().replace("<|im_start|>assistant", "<|im_start|>helper"))
    argv = ["train", "--resume", *_train(model, qa_file, run)[1:]]
    one_line_error(capsys, argv, "model.chat_template")


def test_the_chat_template_of_tokenizer_config_is_part_of_the_fingerprint(model):
    from mopd.core.fingerprint import model_fingerprint

    (model / "chat_template.jinja").unlink()
    conf = json.loads((model / "tokenizer_config.json").read_text())
    conf["chat_template"] = "{{ messages[0]['content'] }}"
    (model / "tokenizer_config.json").write_text(json.dumps(conf))
    first = model_fingerprint(model)
    conf["chat_template"] = "{{ messages[-1]['content'] }}"
    (model / "tokenizer_config.json").write_text(json.dumps(conf))
    second = model_fingerprint(model)
    assert first["weights"] == second["weights"] and first["chat_template"] != second["chat_template"]


def test_a_run_recorded_without_a_template_hash_still_resumes(model, qa_file, tmp_path):
    """run.json files written before the template was fingerprinted compare on what they hold."""
    from mopd.config import resolve
    from mopd.train.run_dir import prepare_run_dir
    from tests.helpers.training import tiny_overrides

    run = tmp_path / "run"
    _started_run(model, qa_file, run)
    ident = json.loads((run / "run.json").read_text())
    del ident["model"]["chat_template"]
    (run / "run.json").write_text(json.dumps(ident))
    prepare_run_dir(resolve("tiny_cmas_rl", tiny_overrides(model, qa_file, run)), resume=True)


# ------------------------------------------------------------------------------------ question files


def test_dev_questions_that_are_training_questions_are_counted_said_and_recorded(
        tiny_model_dir, qa_file, tmp_path, capsys, monkeypatch):
    import mopd.train.trainer as trainer_module

    dev = tmp_path / "dev.jsonl"
    rows = [json.loads(line) for line in open(qa_file)]
    rows[2]["question"] = "  where was BAND 2 formed "         # the same question, case and spacing aside
    dev.write_text("".join(json.dumps(dict(r, id=f"d{i}")) + "\n" for i, r in enumerate(rows[:3]))
                   + json.dumps({"id": "new", "question": "Who sang?", "golden_answers": ["x"]}) + "\n")
    recorded = []

    class Trainer:                                   # what `mopd train` calls, without the training
        rank, step = 0, 0

        def __init__(self, cfg, resume=False):
            self.logger = type("Log", (), {"event": lambda _, step, kind, line: recorded.append((kind, line))})()

        def fit(self, steps=None):
            return {}

        def close(self, failed=False):
            pass

    monkeypatch.setattr(trainer_module, "PolicyTrainer", Trainer)
    assert main(_train(tiny_model_dir, qa_file, tmp_path / "run", f"data.dev={dev}")) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if "data.dev" in line]
    assert len(said) == 1 and "3 of the 4 validation questions are also in data.train" in said[0], said
    assert "ids d0, d1, d2" in said[0]
    assert ("data", said[0].removeprefix("mopd: ")) in recorded


def test_a_question_file_that_starts_with_a_bom(qa_file, tmp_path):
    from mopd.core.qa import load_questions
    from mopd.train.preflight import check_questions

    f = tmp_path / "bom.jsonl"
    f.write_bytes(b"\xef\xbb\xbf" + open(qa_file, "rb").read())
    questions, _ = load_questions(f)
    plain, _ = load_questions(qa_file)
    assert [(q.id, q.question) for q in questions] == [(q.id, q.question) for q in plain]
    assert check_questions("data.train", str(f)) == len(plain)
