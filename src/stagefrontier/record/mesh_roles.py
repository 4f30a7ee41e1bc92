"""A rank's role read from a ``DeviceMesh``: its coordinate on the mesh dimensions named.

With ``role_dims=("pp",)`` on a ``("pp", "dp")`` mesh, the ranks of pipeline stage 1 all get
the role ``pp1``: their data-parallel replicas are the homogeneous group analyzed together.
Several dimensions join with ``-`` (``pp1-tp0``). Reads the mesh's attributes only, so this
module imports no torch.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from ..errors import RolesError


def mesh_roles(mesh: Any, role_dims: Sequence[str]) -> tuple[str, tuple[str, ...]]:
    """This rank's role on ``mesh`` and the job's full role set (every coordinate combination
    of ``role_dims``). Raises RolesError for a mesh without dimension names, a dimension it
    lacks, or a rank outside the mesh."""
    if isinstance(role_dims, str):
        role_dims = (role_dims,)
    names = tuple(getattr(mesh, "mesh_dim_names", None) or ())
    if not role_dims:
        raise RolesError("role_dims must name at least one mesh dimension, e.g. ('pp',)")
    unknown = [dim for dim in role_dims if dim not in names]
    if unknown:
        raise RolesError(
            f"role_dims {list(unknown)} are not dimensions of the mesh (its dimensions: "
            f"{list(names) or 'unnamed'}); name them with init_device_mesh(mesh_dim_names=...)"
        )
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        raise RolesError("this rank is not part of the mesh given to StageTimer")
    axes = [names.index(dim) for dim in role_dims]
    sizes = [int(mesh.size(axis)) for axis in axes]
    role = _role_name(role_dims, [int(coordinate[axis]) for axis in axes])
    every = tuple(
        _role_name(role_dims, list(combo))
        for combo in itertools.product(*(range(size) for size in sizes))
    )
    return role, every


def _role_name(dims: Sequence[str], coords: Sequence[int]) -> str:
    return "-".join(f"{dim}{c}" for dim, c in zip(dims, coords, strict=True))
