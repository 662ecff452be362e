"""Key-group labels are part of a checkpoint: reused on restart, and a changed count refused.
(Their placement on Spark's partitions is checked against Spark in integration_tests.)"""

import pytest

from jobs.pipeline import group_labels
from operators.errors import ConfigError


def test_labels_are_distinct_and_kept_with_the_checkpoint(tmp_path):
    labels = group_labels(8, 2, tmp_path)
    assert len(set(labels)) == 8
    assert group_labels(8, 4, tmp_path) == labels  # the checkpoint's labels, not recomputed
    assert group_labels(8, 2) == labels  # deterministic


def test_a_changed_key_group_count_is_refused_on_restart(tmp_path):
    group_labels(8, 2, tmp_path)
    with pytest.raises(ConfigError, match="spark.key_groups is 4.*written with 8"):
        group_labels(4, 2, tmp_path)


def test_a_checkpoint_committed_before_labels_keeps_the_plain_group_numbers(tmp_path):
    (tmp_path / "commits").mkdir()
    (tmp_path / "commits" / "0").write_text("v1")
    assert group_labels(8, 2, tmp_path) == list(range(8))
    assert group_labels(8, 2, tmp_path) == list(range(8))  # and remembers them
    assert group_labels(8, 2, tmp_path / "fresh") != list(range(8))  # 0..7 land 3 : 5 on 2 partitions
