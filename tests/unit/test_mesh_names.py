"""Mesh names: what a state file may be named after."""

from __future__ import annotations

import pytest

from monarch_kernel.errors import MeshSpecError
from monarch_kernel.hosts._registry import check_name


@pytest.mark.parametrize("name", ["train", "a", "exp-1.2_b", "x" * 64])
def test_good_names_are_accepted(name):
    assert check_name(name) == name


@pytest.mark.parametrize(
    "name",
    ["train\n", "\ntrain", "tr ain", "", "-lead", ".hidden", "a/b", "../x", "x" * 65, "naïve", 3, None],
)
def test_a_name_with_a_newline_a_path_or_other_characters_is_refused_with_the_rule(name):
    with pytest.raises(MeshSpecError, match="letters, digits"):
        check_name(name)
