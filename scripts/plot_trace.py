"""Renders a trace written by `mk trace` as a PNG timeline: one row per SM, one colour per op, waits in grey."""
import argparse
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("trace", help="trace.json from `mk trace`")
    parser.add_argument("--out", default="trace.png")
    parser.add_argument("--max-sms", type=int, default=132, help="draw at most this many SMs")
    args = parser.parse_args()

    with open(args.trace) as f:
        events = json.load(f)["traceEvents"]
    slices = [e for e in events if e.get("ph") == "X" and e.get("tid") == 0 and e["pid"] < args.max_sms]
    if not slices:
        sys.exit(f"{args.trace}: no consumer slices to draw")
    categories = sorted({e["cat"] for e in slices if e["cat"] != "wait"})
    palette = plt.get_cmap("tab10")
    colour = {c: palette(i % 10) for i, c in enumerate(categories)}
    colour["wait"] = (0.8, 0.8, 0.8)

    num_sms = max(e["pid"] for e in slices) + 1
    fig, ax = plt.subplots(figsize=(16, max(4, num_sms * 0.08)))
    for category in categories + ["wait"]:
        bars = [(e["ts"], e["dur"], e["pid"]) for e in slices if e["cat"] == category]
        for ts, dur, sm in bars:
            ax.broken_barh([(ts, dur)], (sm - 0.4, 0.8), facecolors=colour[category], linewidth=0)
    ax.set_xlabel("time (us)")
    ax.set_ylabel("SM")
    ax.set_ylim(-1, num_sms)
    ax.invert_yaxis()
    handles = [plt.Rectangle((0, 0), 1, 1, color=colour[c]) for c in categories + ["wait"]]
    ax.legend(handles, categories + ["wait"], loc="upper right", ncol=len(handles), fontsize="small")
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
