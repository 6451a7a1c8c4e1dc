"""A node's sysfs as the probe reads it: three HCAs under class/infiniband (two RoCE ports, one up and one down,
and an InfiniBand one), with their firmware, link and GID tables."""

from __future__ import annotations

from pathlib import Path

# sysfs writes GIDs in full form; an unused entry is all zeros and its type reads as EINVAL (absent here).
GIDS = {
    0: ("fe80:0000:0000:0000:ba59:9fff:fe1d:7a10", "IB/RoCE v1", "net1-0"),
    1: ("fe80:0000:0000:0000:ba59:9fff:fe1d:7a10", "RoCE v2", "net1-0"),
    2: ("0000:0000:0000:0000:0000:ffff:0a00:010b", "IB/RoCE v1", "net1-0"),
    3: ("0000:0000:0000:0000:0000:ffff:0a00:010b", "RoCE v2", "net1-0"),
    4: ("0000:0000:0000:0000:0000:0000:0000:0000", None, None),
}


def make_sysfs(root: Path) -> Path:
    """The tree under *root* (the sysfs mount point); returns its class/infiniband directory."""
    ib = root / "class" / "infiniband"

    def dev(name: str, fw: str, state: str, link: str, gids: dict) -> None:
        d = ib / name
        port = d / "ports" / "1"
        for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
            (port / sub).mkdir(parents=True, exist_ok=True)
        (d / "fw_ver").write_text(fw + "\n")
        (d / "board_id").write_text("MT_0000000222\n")
        (port / "state").write_text(state + "\n")
        (port / "phys_state").write_text("5: LinkUp\n" if "ACTIVE" in state else "3: Disabled\n")
        (port / "link_layer").write_text(link + "\n")
        (port / "rate").write_text("200 Gb/sec (4X HDR)\n")
        for i, (gid, typ, ndev) in gids.items():
            (port / "gids" / str(i)).write_text(gid + "\n")
            if typ:
                (port / "gid_attrs" / "types" / str(i)).write_text(typ + "\n")
                (port / "gid_attrs" / "ndevs" / str(i)).write_text(ndev + "\n")

    dev("mlx5_0", "28.39.1002", "4: ACTIVE", "Ethernet", GIDS)
    dev("mlx5_3", "28.39.1002", "1: DOWN", "Ethernet", {0: GIDS[0]})
    dev("mlx5_1", "20.31.1014", "4: ACTIVE", "InfiniBand", {0: GIDS[0]})
    return ib
