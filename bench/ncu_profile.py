#!/usr/bin/env python3
"""Where a decode step's GPU time goes: Nsight Compute's per-kernel metrics,
summed per kernel.

usage: ncu_profile.py NCU_OUTPUT OUT_JSON [--peak-gbs G] [--what TEXT]

NCU_OUTPUT is what `ncu --csv --print-units base --metrics
gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum APP` printed
(the application's own lines and ncu's ==PROF== lines among it are skipped:
only the rows after ncu's CSV header count). Each launch is one row per
metric; launches are grouped by kernel (its demangled name with template
arguments, without the parameter list). OUT_JSON gets, per kernel, sorted by
time: launches, total and mean microseconds, its share of the profiled time,
DRAM bytes read + written and the GB/s that makes (and the fraction of
--peak-gbs when given). Kernels run one at a time under ncu, so the shares
say where the time goes, not what the overlapped run takes.
"""
import csv
import json
import re
import sys

METRICS = ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum")
# --print-units base gives ns and bytes; scaled units are read too.
SCALE = {"nsecond": 1e-9, "ns": 1e-9, "usecond": 1e-6, "us": 1e-6, "msecond": 1e-3, "ms": 1e-3,
         "second": 1.0, "s": 1.0, "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9,
         "KB": 1e3, "MB": 1e6, "GB": 1e9}


def kernel_key(name):
    """'void matvec_q8_kernel<12, 1>(mvq_args)' -> 'matvec_q8_kernel<12, 1>'."""
    name = re.sub(r"^void\s+", "", name.strip())
    depth = 0
    for i, ch in enumerate(name):  # the parameter list: the first '(' outside <...>
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0 and i > 0:
            return name[:i]
    return name


def read_launches(path):
    """{launch id: {"kernel": key, metric: value in s or bytes}} from ncu's CSV rows."""
    header, launches = None, {}
    with open(path, errors="replace") as f:
        for line in f:
            if not line.startswith('"'):
                continue
            row = next(csv.reader([line]))
            if header is None:
                if row[:2] == ["ID", "Process ID"]:
                    header = {k: i for i, k in enumerate(row)}
                continue
            if len(row) != len(header):
                continue
            metric = row[header["Metric Name"]]
            if metric not in METRICS:
                continue
            unit = row[header["Metric Unit"]]
            if unit not in SCALE:
                raise ValueError(f"{path}: unit '{unit}' of {metric} is not known")
            value = float(row[header["Metric Value"]].replace(",", "")) * SCALE[unit]
            launch = launches.setdefault(row[header["ID"]],
                                         {"kernel": kernel_key(row[header["Kernel Name"]])})
            launch[metric] = value
    if header is None:
        raise ValueError(f"{path}: no ncu CSV header (\"ID\",\"Process ID\",...)")
    return launches


def summarize(launches, peak_gbs=None):
    per = {}
    for l in launches.values():
        k = per.setdefault(l["kernel"], {"kernel": l["kernel"], "launches": 0, "s": 0.0, "bytes": 0.0})
        k["launches"] += 1
        k["s"] += l.get(METRICS[0], 0.0)
        k["bytes"] += l.get(METRICS[1], 0.0) + l.get(METRICS[2], 0.0)
    total = sum(k["s"] for k in per.values())
    rows = []
    for k in sorted(per.values(), key=lambda k: -k["s"]):
        gbs = k["bytes"] / k["s"] / 1e9 if k["s"] > 0 else None
        rows.append({"kernel": k["kernel"], "launches": k["launches"],
                     "us_total": k["s"] * 1e6, "us_mean": k["s"] * 1e6 / k["launches"],
                     "time_frac": k["s"] / total if total > 0 else None,
                     "dram_bytes": k["bytes"], "gbs": gbs,
                     "bw_frac": gbs / peak_gbs if gbs is not None and peak_gbs else None})
    return {"launches": len(launches), "us_total": total * 1e6, "kernels": rows}


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    peak, what = None, None
    rest = argv[3:]
    while rest:
        if rest[0] == "--peak-gbs" and len(rest) > 1:
            peak = float(rest[1])
        elif rest[0] == "--what" and len(rest) > 1:
            what = rest[1]
        else:
            sys.exit(f"ncu_profile.py: unknown argument '{rest[0]}'")
        rest = rest[2:]
    out = summarize(read_launches(argv[1]), peak)
    if not out["launches"]:
        sys.exit(f"ncu_profile.py: {argv[1]} has no kernel rows with {', '.join(METRICS)}")
    out["what"], out["peak_gbs"] = what, peak
    json.dump(out, open(argv[2], "w"), indent=1)
    for r in out["kernels"][:12]:
        print("%5.1f%%  %9.1f us  %6d x  %7s GB/s  %s" % (
            100 * (r["time_frac"] or 0), r["us_total"], r["launches"],
            "%.0f" % r["gbs"] if r["gbs"] is not None else "-", r["kernel"]))


if __name__ == "__main__":
    main(sys.argv)
