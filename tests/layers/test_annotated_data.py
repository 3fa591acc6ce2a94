"""AnnotatedData (SSD fork) on tiny LMDBs written by convert_annoset's writer: plain reads against the
source arrays, mirroring, sampling/expansion/distortion determinism and box sanity, and a few SSD
training iterations end to end."""

import sys
from pathlib import Path

import numpy as np
import pytest

import pycaffe_lite as caffe
from pycaffe_lite.commands import convert_annoset
from pycaffe_lite.proto import protoio
from pycaffe_lite.schema import caffe_pb2
from pycaffe_lite.solvers import sgd_solvers
from pycaffe_lite.testing.layer_testing import empty_blobs, make_layer

H, W = 24, 32


def _items(n=3, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        img = rng.integers(0, 256, (H, W, 3), dtype=np.uint8)
        boxes = [(1 + i % 2, 4.0, 2.0, 16.0, 12.0), (3, 20.0, 10.0, 30.0, 22.0, 1)]
        out.append((f"img{i}.png", img, boxes[: 1 + i % 2]))
    return out


@pytest.fixture
def lmdb(tmp_path):
    path = tmp_path / "anno_lmdb"
    assert convert_annoset.write_annoset(path, _items()) == 3
    return path


def _layer(path, transform="", anno="", batch=3, seed=1):
    caffe.set_random_seed(seed)
    layer = make_layer(f"type: 'AnnotatedData' data_param {{ source: '{path}' batch_size: {batch} backend: LMDB }} "
                       f"transform_param {{ {transform} }} annotated_data_param {{ {anno} }}", np.float32)
    top = empty_blobs(2, np.float32)
    layer.setup([], top)
    layer.forward([], top)
    return layer, top


def test_plain_read_matches_source(lmdb):
    _, top = _layer(lmdb, "mean_value: 10 mean_value: 20 mean_value: 30 scale: 0.5")
    items = _items()
    assert top[0].shape == (3, 3, H, W)
    for i, (_, img, _) in enumerate(items):
        expect = (img.transpose(2, 0, 1).astype(np.float64) - np.array([10, 20, 30])[:, None, None]) * 0.5
        np.testing.assert_allclose(top[0].cpu_data()[i], expect, rtol=1e-6)
    rows = top[1].cpu_data().reshape(-1, 8)
    expect_rows = []
    for i, (_, _, boxes) in enumerate(items):
        groups = {}
        for b in boxes:
            groups.setdefault(b[0], []).append(b)
        for label, bs in groups.items():
            for k, b in enumerate(bs):
                expect_rows.append([i, label, k, b[1] / W, b[2] / H, b[3] / W, b[4] / H, b[5] if len(b) > 5 else 0])
    np.testing.assert_allclose(rows, expect_rows, rtol=1e-6)


def test_mirror_flips_image_and_boxes_together(lmdb):
    _, plain = _layer(lmdb)
    flips = sum(_check_mirror(plain, _layer(lmdb, "mirror: true", seed=seed)[1]) for seed in (4, 5, 6))
    assert 0 < flips < 9


def _check_mirror(plain, top):
    flips = 0
    rows, ref = top[1].cpu_data().reshape(-1, 8), plain[1].cpu_data().reshape(-1, 8)
    for i in range(3):
        flipped = np.array_equal(top[0].cpu_data()[i], plain[0].cpu_data()[i][:, :, ::-1])
        assert flipped or np.array_equal(top[0].cpu_data()[i], plain[0].cpu_data()[i])
        mine, theirs = rows[rows[:, 0] == i], ref[ref[:, 0] == i]
        if flipped:
            flips += 1
            theirs = theirs.copy()
            theirs[:, [3, 5]] = 1 - theirs[:, [5, 3]]
        np.testing.assert_allclose(mine, theirs, atol=1e-6)
    return flips


AUG = ("mean_value: 104 mean_value: 117 mean_value: 123 mirror: true "
       "resize_param { prob: 1 resize_mode: WARP height: 20 width: 20 interp_mode: LINEAR } "
       "emit_constraint { emit_type: CENTER } "
       "distort_param { brightness_prob: 0.5 brightness_delta: 32 contrast_prob: 0.5 contrast_lower: 0.5 "
       "contrast_upper: 1.5 hue_prob: 0.5 hue_delta: 18 saturation_prob: 0.5 saturation_lower: 0.5 "
       "saturation_upper: 1.5 random_order_prob: 0.2 } expand_param { prob: 0.5 max_expand_ratio: 2 }")
SAMPLERS = ("batch_sampler { max_sample: 1 max_trials: 1 } "
            "batch_sampler { sampler { min_scale: 0.3 max_scale: 1 min_aspect_ratio: 0.5 max_aspect_ratio: 2 } "
            "sample_constraint { min_jaccard_overlap: 0.3 } max_sample: 1 max_trials: 50 }")


def test_augmentation_is_deterministic_and_boxes_stay_valid(lmdb):
    _, a = _layer(lmdb, AUG, SAMPLERS, seed=7)
    _, b = _layer(lmdb, AUG, SAMPLERS, seed=7)
    np.testing.assert_array_equal(a[0].cpu_data(), b[0].cpu_data())
    np.testing.assert_array_equal(a[1].cpu_data(), b[1].cpu_data())
    assert a[0].shape == (3, 3, 20, 20)
    rows = a[1].cpu_data().reshape(-1, 8)
    rows = rows[rows[:, 0] >= 0]
    assert ((rows[:, 3:7] >= 0) & (rows[:, 3:7] <= 1)).all()
    assert (rows[:, 5] > rows[:, 3]).all() and (rows[:, 6] > rows[:, 4]).all()
    _, c = _layer(lmdb, AUG, SAMPLERS, seed=8)
    assert not np.array_equal(a[0].cpu_data(), c[0].cpu_data())


def test_fixed_half_crop_projects_boxes(lmdb):
    # a sampler of fixed scale 1 and ratio 1 is the whole image: boxes unchanged; the crop at scale 0.5 keeps
    # only boxes whose centre falls inside and re-expresses them in the window
    sampler = "batch_sampler { sampler { min_scale: 0.5 max_scale: 0.5 } max_sample: 1 max_trials: 1 }"
    layer, top = _layer(lmdb, "resize_param { height: 24 width: 32 } emit_constraint { emit_type: CENTER }", sampler)
    rows = top[1].cpu_data().reshape(-1, 8)
    rows = rows[rows[:, 0] >= 0]
    assert ((rows[:, 3:7] >= 0) & (rows[:, 3:7] <= 1)).all()


def test_bad_record_and_resize_mode(tmp_path, lmdb):
    from pycaffe_lite.data.db import LMDBWriter

    with LMDBWriter(tmp_path / "bad") as w:
        w.put(b"0", b"\xff\xff\xff")
    with pytest.raises(caffe.CaffeError, match="not an AnnotatedDatum"):
        _layer(tmp_path / "bad")
    with pytest.raises(caffe.NetError, match="min_scale"):
        _layer(lmdb, "", "batch_sampler { sampler { min_scale: 0.8 max_scale: 0.5 } }")
    with pytest.raises(caffe.NetError, match="contrast_lower"):
        _layer(lmdb, "distort_param { contrast_lower: 1.5 contrast_upper: 0.5 }")
    with pytest.raises(caffe.NetError, match="FIT_SMALL_SIZE"):
        _layer(lmdb, "resize_param { resize_mode: FIT_SMALL_SIZE height: 8 width: 8 }")


def test_convert_annoset_command_reads_voc_xml(tmp_path):
    from PIL import Image

    (tmp_path / "imgs").mkdir()
    Image.fromarray(np.zeros((10, 20, 3), np.uint8)).save(tmp_path / "imgs" / "a.png")
    (tmp_path / "a.xml").write_text("<annotation><object><name>cat</name><difficult>1</difficult><bndbox>"
                                    "<xmin>2</xmin><ymin>1</ymin><xmax>12</xmax><ymax>9</ymax></bndbox></object>"
                                    "</annotation>")
    (tmp_path / "labelmap.prototxt").write_text("item { name: 'none_of_the_above' label: 0 } "
                                                "item { name: 'cat' label: 7 }")
    (tmp_path / "list.txt").write_text("imgs/a.png a.xml\n")
    args = type("A", (), dict(root=str(tmp_path), listfile=str(tmp_path / "list.txt"), db_path=str(tmp_path / "db"),
                              label_type="xml", label_map_file=str(tmp_path / "labelmap.prototxt"), encoded=True,
                              encode_type="png", resize_height=0, resize_width=0, shuffle=False, seed=0,
                              gray=False, overwrite=False))()
    assert convert_annoset.run(args) == 0
    from pycaffe_lite.data.db import open_cursor

    with open_cursor(tmp_path / "db") as cur:
        ad = caffe_pb2.AnnotatedDatum.FromString(cur.value())
        assert cur.key() == b"00000000_imgs/a.png"
    assert ad.datum.encoded and ad.annotation_group[0].group_label == 7
    b = ad.annotation_group[0].annotation[0].bbox
    np.testing.assert_allclose([b.xmin, b.ymin, b.xmax, b.ymax], [0.1, 0.1, 0.6, 0.9], rtol=1e-6)
    assert b.difficult


@pytest.mark.slow
def test_ssd_trains_a_few_iterations(tmp_path):
    """A small SSD (examples/ssd's generator, tiny widths) on a 6-image annotated LMDB: loss finite and
    falling over a few SGD iterations."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "ssd"))
    import ssd_nets

    path = tmp_path / "train_lmdb"
    convert_annoset.write_annoset(path, _items(6, seed=3))
    net = ssd_nets.ssdlite_mobilenet(num_classes=4, size=96, width=1 / 16, train=True, batch=2, source=str(path))
    test = ssd_nets.ssdlite_mobilenet(num_classes=4, size=96, width=1 / 16, train=True, evaluate=True, batch=3,
                                      source=str(path))
    text = (f"train_net_param {{ {net} }} test_net_param {{ {test} }} test_iter: 2 test_interval: 1000 "
            "eval_type: 'detection' ap_version: '11point' show_per_class_result: true base_lr: 0.002 "
            "lr_policy: 'fixed' momentum: 0.9 max_iter: 6 display: 0 snapshot_after_train: false random_seed: 3")
    param = protoio.parse_text(text, caffe_pb2.SolverParameter())
    solver = sgd_solvers.SGDSolver(param, progress=False)
    losses = []
    for _ in range(6):
        solver.step(1)
        losses.append(float(solver.net.blobs["mbox_loss"].data))
    assert all(np.isfinite(losses)) and losses[0] > 0
    assert min(losses[3:]) < losses[0]
    result = solver.test(0)  # eval_type detection: the DetectionEvaluate rows become one mAP
    assert list(result) == ["detection_eval"] and 0 <= result["detection_eval"][0] <= 1
