"""The goals and the printed table: medians (min-max) over the passes, ratios to the baselines
taken within a pass, and the exit status (1 if a target is missed or a client saw errors)."""

from __future__ import annotations

import statistics

from loadtest.bench.transactions import print_transactions

# The project's goals: (broker configurations, baseline, minimum ratio).  A goal is
# met when the best of its broker configurations reaches the ratio in the median pass.
TARGETS = (
    (("apiversions 1w 100x1", "apiversions 2w 100x1"), "echo 100x1", 0.8),
    (("apiversions 1w 10x50", "apiversions 2w 10x50"), "echo 10x50", 0.4),
    (("accept+handoff+register 2w",), "raw accept+close", 0.6),
    # Writing the event log costs at most 5 % of small-request throughput.
    (("apiversions 1w 100x1",), "apiversions 1w 100x1, event log off", 0.95),
    (("apiversions 1w 10x50",), "apiversions 1w 10x50, event log off", 0.95),
)
UNTARGETED = (("metadata 2w 100x1", "echo 100x1"),
              ("accept limits on", "accept+handoff+register 2w"),
              ("accept+handoff+register 2w", "echo accept+request+close"),
              ("produce 1KiB, others quoted", "produce 1KiB acks=1"))
FAIRNESS_TARGET = 2.0  # p99 during a storm / p99 without one, with the KIP-402 bounds
# Broker CPU (all processes) per MB, and zero-copy consume against the copying path.
PRODUCE_MS_PER_MB = 1.6
CONSUME_MS_PER_MB = 0.4
ZERO_COPY_SPEEDUP = 2.0  # MB/s, where the client allows (it is not using a whole core)
CLIENT_BOUND = 0.9  # a client busy this share of its elapsed time bounds the rate itself
CONTROL_PLANE_P99_MS = 20.0  # admin requests on the control plane while saturated


def _is_rate(figure: dict) -> bool:
    """A request or accept rate of the main table (the other figures have tables of their
    own: ACLs, fetch sessions, never-readers, refusals)."""
    return ("rps" in figure or "rate" in figure) and ("responses" in figure
                                                      or "connections" in figure)


def summarize(passes: list[dict[str, dict]]) -> int:
    def spread(values):
        return f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"

    print(f"\n{'configuration':32} {'per second, median (min-max)':>34} {'server us/op':>13} errors")
    errors = 0
    for name in [n for n, figure in passes[0].items() if "1KiB" not in n and not n.startswith(
            ("p99", "burst", "control plane", "data listener", "group join", "offset commit",
             "security")) and _is_rate(figure)]:
        rates = [p[name].get("rps", p[name].get("rate")) for p in passes]
        ops = [p[name].get("responses", p[name].get("connections")) for p in passes]
        cost = statistics.median(p[name]["server_cpu"] / max(1, n) * 1e6
                                 for p, n in zip(passes, ops))
        failed = sum(p[name]["errors"] for p in passes)
        errors += failed
        print(f"{name:32} {spread(rates):>34} {cost:>13.2f} {failed}")
    print(f"\n{'log (confluent-kafka, 2 partitions)':32} {'MB/s':>16} {'records/s':>16} "
          f"{'CPU s/MB':>10} errors")
    for name in [n for n in passes[0] if "1KiB" in n]:
        megabytes = [p[name]["bytes"] / 1e6 / p[name]["seconds"] for p in passes]
        rates = [p[name]["records"] / p[name]["seconds"] for p in passes]
        cost = statistics.median(p[name]["server_cpu"] / max(1e-9, p[name]["bytes"] / 1e6)
                                 for p in passes)
        failed = sum(p[name]["errors"] for p in passes)
        errors += failed
        print(f"{name:32} {statistics.median(megabytes):>16,.1f} {statistics.median(rates):>16,.0f} "
              f"{cost:>10.4f} {failed}")
    errors += _print_byte_path(passes)
    print(f"\n{'200 x 2 x 1 MiB produce burst':32} {'peak RSS MiB':>14} {'idle RSS MiB':>14} "
          f"{'seconds':>9} errors")
    for name in ("burst pool on", "burst pool off"):
        peak = statistics.median(p[name]["peak_rss"] for p in passes) / 2**20
        idle = statistics.median(p[name]["baseline_rss"] for p in passes) / 2**20
        took = statistics.median(p[name]["seconds"] for p in passes)
        failed = sum(p[name]["errors"] for p in passes)
        errors += failed
        print(f"{name:32} {peak:>14,.0f} {idle:>14,.0f} {took:>9.2f} {failed}")
    print(f"\n{'latency on 20 existing connections':32} {'p99 us quiet':>14} {'p99 us storm':>14} "
          f"{'ratio':>7} {'storm conn/s':>13}")
    for label in ("bounded", "unbounded", "bounded, creation rate 500/s"):
        quiet = [p[f"p99 quiet {label}"]["p99_us"] for p in passes]
        stormy = [p[f"p99 storm {label}"]["p99_us"] for p in passes]
        ratio = statistics.median(s / max(q, 1e-9) for q, s in zip(quiet, stormy))
        rate = statistics.median(p[f"p99 storm {label}"]["storm_rate"] for p in passes)
        errors += sum(p[f"p99 {kind} {label}"]["errors"] for p in passes for kind in ("quiet", "storm"))
        print(f"{label:32} {statistics.median(quiet):>14,.0f} {statistics.median(stormy):>14,.0f} "
              f"{ratio:>7.2f} {rate:>13,.0f}")
    missed, failed = _print_control_plane(passes)
    errors += failed
    errors += _print_groups(passes)
    errors += print_transactions(passes)
    errors += _print_security(passes)
    acl_missed, acl_errors = _print_authorization(passes)
    errors += acl_errors
    missed += acl_missed
    session_missed, session_errors = _print_sessions(passes)
    errors += session_errors
    missed += session_missed
    protection_missed, protection_errors = _print_protections(passes)
    errors += protection_errors
    missed += protection_missed
    print(f"\n{'ratio (same pass)':58} {'median (min-max)':>18}  target")
    for measured_names, baseline, target in TARGETS:
        best = 0.0
        for measured in measured_names:
            best = max(best, _print_ratio(passes, measured, baseline, f">= {target}"))
        met = best >= target
        missed += not met
        print(f"{'':58} {'goal ' + ('met' if met else 'MISSED'):>18}")
    for measured, baseline in UNTARGETED:
        _print_ratio(passes, measured, baseline, "(no target)")
    fairness = statistics.median(p["p99 storm bounded"]["p99_us"] / max(p["p99 quiet bounded"]["p99_us"], 1e-9)
                                 for p in passes)
    met = fairness <= FAIRNESS_TARGET
    missed += not met
    print(f"{'storm p99 / quiet p99, bounded':58} {fairness:>6.2f}{'':13}  <= {FAIRNESS_TARGET}  "
          f"{'goal met' if met else 'goal MISSED'}")
    return 1 if missed or errors else 0


def _print_groups(passes) -> int:
    """Print the consumer-group figures; return the errors seen."""
    joins = [p["group join"]["seconds"] for p in passes]
    commits = [p["offset commit"] for p in passes]
    print(f"\n{'consumer groups':48} {'median':>8} {'min':>8} {'max':>8}")
    print(f"{'3rd member joins a group of 2: all assigned, s':48} {statistics.median(joins):>8.3f} "
          f"{min(joins):>8.3f} {max(joins):>8.3f}")
    for key in ("p50_ms", "p99_ms"):
        values = [c[key] for c in commits]
        print(f"{'OffsetCommit round trip ' + key.replace('_', ' '):48} "
              f"{statistics.median(values):>8.3f} {min(values):>8.3f} {max(values):>8.3f}")
    return sum(p["group join"]["errors"] + p["offset commit"]["errors"] for p in passes)


def _print_rows(passes, title: str, prefix: str) -> int:
    """The figures named `prefix...`: rate per second and server CPU per operation; returns
    the client errors."""
    print(f"\n{title:32} {'per second, median (min-max)':>34} {'server us/op':>13} errors")
    errors = 0
    for name in [n for n in passes[0] if n.startswith(prefix)]:
        rates = [p[name]["count"] / p[name]["seconds"] for p in passes]
        cost = statistics.median(p[name]["server_cpu"] / max(1, p[name]["count"]) * 1e6
                                 for p in passes)
        failed = sum(p[name]["errors"] for p in passes)
        errors += failed
        unit = " (records)" if "produce" in name and prefix != "handler " else ""
        print(f"{name[len(prefix):] + unit:32} {statistics.median(rates):>16,.0f} "
              f"({min(rates):,.0f}-{max(rates):,.0f}){'':>6} {cost:>13.2f} {failed}")
    return errors


def _ratios(passes, measured: str, baseline: str) -> list[float]:
    return [(p[measured]["count"] / p[measured]["seconds"]) /
            (p[baseline]["count"] / p[baseline]["seconds"]) for p in passes]


def _print_security(passes) -> int:
    """The TLS and SASL figures and their same-pass ratios; returns client errors."""
    if "security scram" not in passes[0]:
        return 0
    errors = _print_rows(passes, "TLS and SASL, 2 workers", "security ")
    for kind in ("requests", "produce", "handshakes"):
        ratios = _ratios(passes, f"security {kind} ssl", f"security {kind} plaintext")
        print(f"{kind + ' over SSL / over PLAINTEXT':58} {statistics.median(ratios):>6.2f} "
              f"({min(ratios):.2f}-{max(ratios):.2f})  (no target)")
    return errors


ACL_TARGET = 0.95  # authorizer on (1,000 ACLs) / off, produce MB/s and Fetch/s


def _print_authorization(passes) -> tuple[int, int]:
    """The authorizer's cost; returns (goals missed, client errors)."""
    if "acl fetch on" not in passes[0]:
        return 0, 0
    errors = _print_rows(passes, "ACLs, 2 workers, SASL_PLAINTEXT", "acl ")
    _print_rows(passes, "ACLs, in one worker's router", "handler ")
    missed = 0
    for prefix, where in (("acl", "end to end"), ("handler", "in the router")):
        for kind in ("produce", "fetch"):
            ratios = _ratios(passes, f"{prefix} {kind} on", f"{prefix} {kind} off")
            met = statistics.median(ratios) >= ACL_TARGET
            missed += not met
            print(f"{kind + ', authorizer on / off, ' + where:58} "
                  f"{statistics.median(ratios):>6.2f} ({min(ratios):.2f}-{max(ratios):.2f})  "
                  f">= {ACL_TARGET} {'met' if met else 'MISSED'}")
    return missed, errors


NEVER_READERS_TARGET = 1.5  # ApiVersions p99 with 300 never-readers / without
REFUSAL_COST_TARGET = 2.5  # parent CPU per refused connection, answered / closed


def _print_protections(passes) -> tuple[int, int]:
    """The protections beyond Kafka's; returns (goals missed, errors)."""
    if "never readers quiet" not in passes[0]:
        return 0, 0
    quiet = [p["never readers quiet"]["p99_us"] for p in passes]
    busy = [p["never readers 300"]["p99_us"] for p in passes]
    errors = sum(p["never readers 300"]["errors"] for p in passes)
    print(f"\n{'ApiVersions p99, one client':48} {'quiet us':>9} {'300 never-readers us':>21}")
    print(f"{'median (min-max)':48} {statistics.median(quiet):>9,.0f} "
          f"{statistics.median(busy):>21,.0f}")
    errors += _print_rows(passes, "refused for the per-IP limit", "refusals ")
    ratios = [b / max(q, 1e-9) for q, b in zip(quiet, busy)]
    costs = [(p["refusals answered"]["server_cpu"] / max(1, p["refusals answered"]["count"]))
             / max(1e-12, p["refusals closed"]["server_cpu"]
                   / max(1, p["refusals closed"]["count"])) for p in passes]
    missed = 0
    for name, values, target, met in (
            ("p99 with 300 never-readers / without", ratios, f"<= {NEVER_READERS_TARGET}",
             statistics.median(ratios) <= NEVER_READERS_TARGET),
            ("parent CPU per refusal, answered / closed", costs, f"<= {REFUSAL_COST_TARGET}",
             statistics.median(costs) <= REFUSAL_COST_TARGET)):
        missed += not met
        print(f"{name:58} {statistics.median(values):>6.2f} ({min(values):.2f}-"
              f"{max(values):.2f})  {target} {'met' if met else 'MISSED'}")
    return missed, errors


SESSION_RATE_TARGET = 2.0  # incremental / full fetches per second, 500 partitions
SESSION_BYTES_TARGET = 0.1  # ... and at most this share of the bytes per round trip


def _print_sessions(passes) -> tuple[int, int]:
    """Fetch sessions (KIP-227); returns (goals missed, errors)."""
    if "sessions on" not in passes[0]:
        return 0, 0
    errors = _print_rows(passes, "fetch sessions, 500 partitions", "sessions ")
    rates = _ratios(passes, "sessions on", "sessions off")
    sizes = [(p["sessions on"]["bytes"] / p["sessions on"]["count"]) /
             (p["sessions off"]["bytes"] / p["sessions off"]["count"]) for p in passes]
    for name, ratios, target, met in (
            ("fetches/s, session / no session", rates, f">= {SESSION_RATE_TARGET}",
             statistics.median(rates) >= SESSION_RATE_TARGET),
            ("bytes per round trip, session / no session", sizes, f"<= {SESSION_BYTES_TARGET}",
             statistics.median(sizes) <= SESSION_BYTES_TARGET)):
        print(f"{name:58} {statistics.median(ratios):>6.3f} ({min(ratios):.3f}-"
              f"{max(ratios):.3f})  {target} {'met' if met else 'MISSED'}")
    missed = sum(not met for met in (statistics.median(rates) >= SESSION_RATE_TARGET,
                                     statistics.median(sizes) <= SESSION_BYTES_TARGET))
    return missed, errors


def _print_control_plane(passes) -> tuple[int, int]:
    """Print the KIP-291 latencies; return (goals missed, errors)."""
    print(f"\n{'admin requests, data plane saturated':48} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'samples':>8} {'flood MB/s':>11} {'depleted s':>11} errors")
    errors, missed = 0, 0
    for plane in ("control plane", "data listener, no control plane"):
        for api in ("Metadata", "DescribeConfigs"):
            name = f"{plane} {api}"
            p50 = statistics.median(p[name]["p50_ms"] for p in passes)
            p99 = statistics.median(p[name]["p99_ms"] for p in passes)
            count = statistics.median(p[name]["count"] for p in passes)
            flood = statistics.median(p[name]["flood_mb_s"] for p in passes)
            depleted = statistics.median(p[name]["depleted_s"] for p in passes)
            failed = sum(p[name]["errors"] for p in passes)
            errors += failed
            print(f"{name:48} {p50:>8.2f} {p99:>8.2f} {count:>8.0f} {flood:>11,.0f} "
                  f"{depleted:>11.1f} {failed}")
            if plane == "control plane":
                met = p99 <= CONTROL_PLANE_P99_MS
                missed += not met
                print(f"{'':48} p99 <= {CONTROL_PLANE_P99_MS:.0f} ms: "
                      f"{'goal met' if met else 'goal MISSED'}")
    return missed, errors


def _print_ratio(passes, measured: str, baseline: str, note: str) -> float:
    ratios = [_rate(p[measured]) / _rate(p[baseline]) for p in passes]
    median = statistics.median(ratios)
    print(f"{measured + ' / ' + baseline:58} {median:>6.2f} ({min(ratios):.2f}-{max(ratios):.2f})  "
          f"{note}")
    return median


def _rate(result: dict) -> float:
    if "rps" in result or "rate" in result:
        return result.get("rps", result.get("rate"))
    return result["bytes"] / result["seconds"]


def _per_mb(figures: dict, seconds: float) -> float:
    return 1000 * seconds / max(1e-9, figures["bytes"] / 1e6)


def _print_byte_path(passes: list[dict[str, dict]]) -> int:
    """The byte path's targets; returns 1 if one is missed."""
    produced = [p["produce 1KiB acks=1"] for p in passes]
    zero = [p["consume 1KiB"] for p in passes]
    copied = [p["consume 1KiB, copying"] for p in passes]
    produce_ms = statistics.median(_per_mb(f, f["server_cpu"]) for f in produced)
    user_ms = statistics.median(_per_mb(f, f.get("server_user", 0)) for f in produced)
    floor_ms = statistics.median(_per_mb(f, f["write_floor"]) for f in produced)
    consume_ms = statistics.median(_per_mb(f, f["server_cpu"]) for f in zero)
    copied_ms = statistics.median(_per_mb(f, f["server_cpu"]) for f in copied)
    speedup = statistics.median((z["bytes"] / z["seconds"]) / (c["bytes"] / c["seconds"])
                                for z, c in zip(zero, copied))
    client_busy = statistics.median(f["client_cpu"] / f["seconds"] for f in zero)
    client_bound = client_busy >= CLIENT_BOUND
    missed = [produce_ms > PRODUCE_MS_PER_MB, consume_ms > CONSUME_MS_PER_MB,
              speedup < ZERO_COPY_SPEEDUP and not client_bound]
    print(f"\n{'byte path':32} {'figure':>10} {'target':>10} {'met':>5}")
    print(f"{'produce broker ms CPU per MB':32} {produce_ms:>10.2f} {PRODUCE_MS_PER_MB:>10.2f} "
          f"{'no' if missed[0] else 'yes':>5}   (user {user_ms:.2f}, kernel "
          f"{produce_ms - user_ms:.2f}; file-write floor {floor_ms:.2f} ms/MB)")
    print(f"{'consume broker ms CPU per MB':32} {consume_ms:>10.2f} {CONSUME_MS_PER_MB:>10.2f} "
          f"{'no' if missed[1] else 'yes':>5}   (copying path {copied_ms:.2f} ms/MB)")
    verdict = "no" if missed[2] else "yes" if speedup >= ZERO_COPY_SPEEDUP else "n/a"
    print(f"{'consume MB/s zero-copy / copying':32} {speedup:>10.2f} {ZERO_COPY_SPEEDUP:>10.2f} "
          f"{verdict:>5}   (consumer busy {100 * client_busy:.0f}% of its time"
          f"{': client-bound' if client_bound else ''})")
    return 1 if any(missed) else 0
