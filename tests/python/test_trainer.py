"""fusebox.Trainer: training from Python on numpy batches (the CPU oracle's session): the loss
falls, the state goes out and comes back by name (state_dict, checkpoints), the trained model
exports to ONNX and runs as the trainer predicts, and bad input is a fusebox.Error."""

import numpy as np
import pytest

import fusebox


@pytest.fixture
def batch():
    rng = np.random.default_rng(0)
    return rng.standard_normal((4, 3, 8, 8)).astype(np.float32), np.array([1, 2, 3, 4])


def trainer(**kw):
    model = fusebox.load("small_cnn", batch=4, image_size=8, num_classes=10, seed=3)
    return fusebox.Trainer(model, **{"optimizer": "adamw", "lr": 3e-3, **kw})


def test_loss_falls_and_predictions_learn(batch):
    x, y = batch
    t = trainer()
    assert [s.name for s in t.batch] == ["input", "labels"]
    losses = [t.step(x, y) for _ in range(25)]  # queued: nothing waits until float()
    assert float(losses[-1]) < float(losses[0]) / 4
    assert losses[-1].ready and "Loss(" in repr(losses[-1])
    assert t.steps == 25
    (logits,) = t.predict(x)
    assert logits.shape == (4, 10)
    assert list(logits.argmax(1)) == list(y)
    t.lr = 1e-4
    assert t.lr == pytest.approx(1e-4)


def test_state_goes_out_and_comes_back(batch, tmp_path):
    x, y = batch
    t = trainer()
    for _ in range(5):
        t.step(x, y)
    state = t.state_dict()
    assert {"conv1.weight", "fc.weight", "bn1.running_mean"} <= set(state)
    fresh = trainer()
    before = fresh.predict(x)[0]
    # Refused, naming the tensor; nothing taken.
    with pytest.raises(fusebox.Error, match="'fc.weight' is not given"):
        fresh.load_state_dict({k: v for k, v in state.items() if k != "fc.weight"})
    with pytest.raises(fusebox.Error, match="'extra' is not a parameter or buffer"):
        fresh.load_state_dict({**state, "extra": np.zeros(3, np.float32)})
    with pytest.raises(fusebox.Error, match="input 'fc.weight' expects f32"):
        fresh.load_state_dict({**state, "fc.weight": state["fc.weight"][:1]})
    np.testing.assert_array_equal(fresh.predict(x)[0], before)
    fresh.load_state_dict(state)
    np.testing.assert_allclose(fresh.predict(x)[0], t.predict(x)[0], rtol=1e-6, atol=1e-6)
    # Not strict: only what is given.
    partial = trainer()
    partial.load_state_dict({"fc.bias": state["fc.bias"]}, strict=False)
    np.testing.assert_array_equal(partial.state_dict()["fc.bias"], state["fc.bias"])
    # A checkpoint: the whole state, the optimizer's too.
    t.save(str(tmp_path / "c.npz"))
    resumed = trainer()
    resumed.load(str(tmp_path / "c.npz"))
    assert resumed.steps == 5
    np.testing.assert_array_equal(float(resumed.step(x, y)), float(t.step(x, y)))


def test_export_runs_as_the_trainer_predicts(batch, tmp_path):
    x, y = batch
    t = trainer()
    for _ in range(5):
        t.step(x, y)
    path = str(tmp_path / "trained.onnx")
    t.export(path)
    exe = fusebox.compile(fusebox.load(path), device="cpu-ref")
    np.testing.assert_allclose(exe(x)[0], t.predict(x)[0], rtol=1e-5, atol=1e-6)


def test_bad_batches_are_errors(batch):
    x, y = batch
    t = trainer()
    with pytest.raises(fusebox.Error, match="input 'labels' expects i64"):
        t.step(x, y.astype(np.int32))
    with pytest.raises(fusebox.Error, match="input 'input' expects f32"):
        t.step(x[:2], y)
    with pytest.raises(fusebox.Error, match="is not one of sgd, adamw"):
        trainer(optimizer="lamb")
    # A label past the 10 classes: the step's error (on the CPU at the step, on CUDA at
    # float(loss)), and the step does not count.
    with pytest.raises(fusebox.Error, match=r"label 99 at position \[3\] is outside \[0, 10\)"):
        float(t.step(x, np.array([1, 2, 3, 99])))
    assert t.steps == 0


def test_onnx_loaded_for_training_keeps_tied_weights_one(tmp_path):
    # The zoo decoder's head is tied to its embedding (an exported Transpose of it): loaded for
    # training, one parameter under the embedding's name; the inference import folds the
    # transpose into a constant of its own, which would train untied.
    path = str(tmp_path / "decoder.onnx")
    fusebox.load("gpt2_test", batch=2).save(path)
    tied = fusebox.Trainer(fusebox.load(path, training=True), optimizer="adamw").state_dict()
    untied = fusebox.Trainer(fusebox.load(path), optimizer="adamw").state_dict()
    assert "transformer.wte.weight" in tied
    assert len(untied) == len(tied) + 1
