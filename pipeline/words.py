"""Numbers and sentences for people: how the report rounds durations, counts and bytes, and
the paragraphs that say what each incident was, what the broker did and who it hurt.

Pure Python on plain rows (dicts, as pipeline.job collects them from the result tables), so it
is tested without Spark.  An incident row carries `totals` {dimension: sum}, `leaders`
{dimension: [{key, value}, ...]} and `keys` {dimension: how many} (pipeline.aggregate.incidents);
an impact row, a client's requests and p99 before and during one incident
(pipeline.aggregate.impact); a groups row, one group's rebalances and share deliveries with
the totals over every group (pipeline.aggregate.groups).
"""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass

DASH = "\u2013"  # between two times: 08:34:01–08:34:05
SLOWER_RATIO = 2.0  # a p99 at least doubled (the sketch's buckets are 25 % wide) ...
SLOWER_MS = 1.0  # ... and by a millisecond or more: slowed
HURT_MS = 10.0  # ... by ten or more: hurt, a rise a person notices
NOTABLE_BLOCKED_MS = 100.0  # acceptor pauses shorter than this in all are not worth a word

REASONS = {
    "per_ip_limit": "over the per-IP connection limit",
    "per_ip_rate": "over the per-IP connection rate",
    "evicted": "evicted to make room",
    "per_user_limit": "over the per-user connection limit",
    "per_user_rate": "over the per-user connection rate",
    "proxy_untrusted": "from an untrusted proxy",
    "proxy_invalid": "with an invalid PROXY header",
    "proxy_timeout": "whose PROXY header never came",
    "max_connections": "over max.connections",
    "creation_rate": "over the connection creation rate",
}
QUOTAS = {
    "producer_byte_rate": "produce byte-rate quota",
    "consumer_byte_rate": "fetch byte-rate quota",
    "request_percentage": "request-time quota",
    "controller_mutation_rate": "controller mutation quota",
}
# How a share group's acquisitions ended (ShareDeliveries), in the order they are told.
ENDINGS = (("accepted", "accepted"), ("released", "released"), ("rejected", "rejected"),
           ("lock_expired", "lock expired"),
           ("delivery_limit", "archived at the delivery limit"))
BLOCKED = {
    "handoff_full": "the workers' hand-off queues were full",
    "connection_limit": "the connection limit was reached",
    "creation_rate": "the connection creation rate was reached",
    "descriptors": "the process ran out of file descriptors",
}


# --- numbers ---------------------------------------------------------------------------------

def missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def duration(ms) -> str:
    """999.816 -> "1.0 s", 7.168 -> "7.2 ms", 0.16 -> "0.16 ms", 125000 -> "2 min 5 s"."""
    if missing(ms):
        return "\u2014"
    if ms == 0:
        return "0 s"
    if ms < 1:
        return f"{ms:.2f} ms"
    if ms < 9.95:
        return f"{ms:.1f} ms"
    if ms < 999.5:
        return f"{ms:.0f} ms"
    seconds = ms / 1000
    if seconds < 9.95:
        return f"{seconds:.1f} s"
    if seconds < 59.5:
        return f"{seconds:.0f} s"
    if seconds < 3599.5:
        minutes, rest = divmod(round(seconds), 60)
        return f"{minutes} min {rest} s" if rest else f"{minutes} min"
    hours, minutes = divmod(round(seconds / 60), 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"


def seconds(value) -> str:
    """A whole number of seconds: 5 -> "5 s", 125 -> "2 min 5 s"."""
    if missing(value):
        return "\u2014"
    return f"{round(value)} s" if value < 60 else duration(value * 1000)


def count(value) -> str:
    """12300.0 -> "12,300"."""
    return "\u2014" if missing(value) else f"{round(value):,}"


def size(value) -> str:
    """Bytes in binary units: 857878318 -> "818 MiB"."""
    if missing(value):
        return "\u2014"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            break
        value /= 1024
    if unit == "B":
        return f"{value:.0f} B"
    return f"{value:.1f} {unit}" if abs(value) < 9.95 else f"{value:,.0f} {unit}"


def percent(ratio) -> str:
    if missing(ratio):
        return "\u2014"
    if 0 < ratio < 0.005:
        return "under 1 %"
    return f"{ratio * 100:.0f} %"


def clock(second) -> str:
    """An epoch second as wall-clock time, UTC."""
    return _utc(second).strftime("%H:%M:%S")


def day(second) -> str:
    return _utc(second).strftime("%-d %b %Y")


def span(start, end) -> str:
    """08:34:01–08:34:05 UTC (5 s); a one-second span is just its second."""
    length = seconds(end - start + 1)
    if start == end:
        return f"{clock(start)} UTC ({length})"
    return f"{clock(start)}{DASH}{clock(end)} UTC ({length})"


def plural(number, word: str, words: str | None = None) -> str:
    return f"{count(number)} {word if round(number) == 1 else (words or word + 's')}"


def listing(items: list[str]) -> str:
    """["a"] -> "a"; ["a", "b", "c"] -> "a, b and c"."""
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def _utc(second) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(second, datetime.timezone.utc)


# --- incidents -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Story:
    """One incident for a person: a title naming its causes, and sentences."""
    number: int
    start: int  # epoch seconds, first and last of the incident
    end: int
    when: str
    title: str
    causes: tuple[str, ...]  # a sentence per cause
    action: str  # what the broker did
    existing: str  # whether the clients already there were hurt
    culprits: frozenset[str]  # client ids that caused it: not counted among its victims

    @property
    def sentences(self) -> list[str]:
        return [*self.causes, self.action, self.existing]

    def as_dict(self) -> dict:
        return {"incident": self.number, "start": self.start, "end": self.end,
                "when": self.when, "title": self.title, "sentences": self.sentences}


def leaders(incident: dict, dimension: str) -> list[dict]:
    return list((incident.get("leaders") or {}).get(dimension) or [])


def total(incident: dict, dimension: str) -> float:
    return (incident.get("totals") or {}).get(dimension) or 0.0


def _first(incident: dict, dimension: str) -> str | None:
    found = leaders(incident, dimension)
    return found[0]["key"] if found else None


def _reached(incident: dict, column: str, limits: dict, limit: str) -> bool:
    value = incident.get(column)
    return not missing(value) and limits.get(limit) is not None and value >= limits[limit]


def keys(incident: dict, dimension: str) -> int:
    """How many different keys (IPs, clients, ...) the dimension had in the incident."""
    return (incident.get("keys") or {}).get(dimension) or len(leaders(incident, dimension))


def _sources(incident: dict, dimension: str, limit: int = 3) -> str:
    """ "127.0.0.2" alone; "127.0.0.2 (180), 127.0.0.3 (20) and 2 others" for several."""
    found = leaders(incident, dimension)
    if len(found) == 1:
        return found[0]["key"]
    named = [f"{item['key']} ({count(item['value'])})" for item in found[:limit]]
    if keys(incident, dimension) > limit:
        named.append(plural(keys(incident, dimension) - limit, "other"))
    return listing(named)


@dataclass(frozen=True)
class Cause:
    title: str
    sentence: str
    culprits: tuple[str, ...] = ()  # client ids behind it: not counted among its victims


def causes(incident: dict, limits: dict) -> list[Cause]:
    """What passed its threshold, in the order a person would look for it."""
    found = []
    if _reached(incident, "peak_rejected_per_s", limits, "rejected_per_second"):
        found.append(_storm(incident))
    if _reached(incident, "peak_depleted_ms", limits, "depleted_ms"):
        found.append(_memory_burst(incident))
    if _reached(incident, "peak_throttle_ms", limits, "throttled_ms"):
        found.append(_throttled(incident))
    if _reached(incident, "peak_control_requests", limits, "control_requests_per_second"):
        found.append(_control_load(incident))
    if _reached(incident, "peak_blocked_ratio", limits, "blocked_ratio"):
        found.append(_acceptor_blocked(incident))
    return found or [Cause("Unusual load", "Load passed one of the thresholds.")]


def _storm(incident: dict) -> Cause:
    origin = ""
    if leaders(incident, "rejected_ip"):
        origin += f" from {_sources(incident, 'rejected_ip')}"
    if leaders(incident, "rejected_principal"):  # per-user limits: who, beyond where
        origin += f" as {_sources(incident, 'rejected_principal')}"
    return Cause(f"Connection storm{origin}",
                 f"A connection storm{origin}: up to "
                 f"{plural(incident['peak_rejected_per_s'], 'connection')} a second were "
                 "refused.")


def _memory_burst(incident: dict) -> Cause:
    client = _first(incident, "client_bytes")
    who = f" (most from client {client})" if client else ""
    worst = min(incident["peak_depleted_ms"] / 1000, 1.0)
    return Cause(f"Memory burst from {client}" if client else "Memory burst",
                 f"A memory burst: large requests{who} filled the request memory pool, which "
                 f"was exhausted for {percent(worst)} of the worst second.",
                 (client,) if client else ())


def _throttled(incident: dict) -> Cause:
    clients = [item["key"] for item in leaders(incident, "throttled_client")]
    client = clients[0] if clients else "a client"
    quota = QUOTAS.get(_first(incident, "throttle_quota"), "quota")
    others = keys(incident, "throttled_client") - 1
    also = f" (and {plural(others, 'other client')})" if others > 0 else ""
    return Cause(f"Throttled client {client}",
                 f"A throttled client: {client}{also} went over its {quota}.", tuple(clients))


def _control_load(incident: dict) -> Cause:
    client = _first(incident, "control_client")
    who = f", most from client {client}" if client else ""
    return Cause(f"Control-plane load from {client}" if client else "Control-plane load",
                 f"Control-plane load: up to "
                 f"{plural(incident['peak_control_requests'], 'request')} a second on the "
                 f"control plane{who}.", (client,) if client else ())


def _acceptor_blocked(incident: dict) -> Cause:
    reason = BLOCKED.get(_first(incident, "blocked_reason"), "it was held back")
    return Cause("Acceptor blocked", f"The acceptor was blocked up to "
                 f"{percent(min(incident['peak_blocked_ratio'], 1.0))} of a second: {reason}.")


def actions(incident: dict) -> str:
    """What the broker did about it, in one sentence."""
    done = []
    refused = total(incident, "rejected_reason")
    if refused:
        reasons = [f"{count(item['value'])} {REASONS.get(item['key'], item['key'])}"
                   for item in leaders(incident, "rejected_reason")]
        done.append(f"refused {plural(refused, 'connection')} ({listing(reasons)})")
    blocked = total(incident, "blocked_reason")
    if blocked >= NOTABLE_BLOCKED_MS:
        reason = BLOCKED.get(_first(incident, "blocked_reason"), "")
        done.append(f"stopped accepting for {duration(blocked)} in all"
                    + (f" ({reason})" if reason else ""))
    muted = total(incident, "muted_proc")
    if muted:
        done.append(f"muted connections {plural(muted, 'time')} until memory was freed (the "
                    f"pool was exhausted for {duration(total(incident, 'depleted_node'))} "
                    "in all)")
    throttled = total(incident, "throttled_client")
    if throttled:
        done.append(_throttle_action(incident, throttled))
    denied = incident.get("denied_requests") or 0
    if denied:
        whom = [name for name in (incident.get("most_denied_principal"),
                                  incident.get("most_denied_resource")) if name]
        done.append(f"denied {plural(denied, 'request')} by ACL"
                    + (f", most to {whom[0]}" if whom else "")
                    + (f" on {whom[1]}" if len(whom) > 1 else ""))
    refused_ids = total(incident, "txn_refused_holder")
    if refused_ids:
        done.append(f"refused transactional ids {plural(refused_ids, 'time')} (a principal's "
                    "share or the whole table in transactions), most to "
                    f"{_first(incident, 'txn_refused_holder')}")
    if not done:
        return "The broker did not refuse, mute or throttle anything."
    return f"The broker {listing(done)}."


def _throttle_action(incident: dict, throttled: float) -> str:
    clients = leaders(incident, "throttled_client")
    if not clients:
        return f"throttled clients for {duration(throttled)} in all"
    if keys(incident, "throttled_client") == 1:
        return f"throttled {clients[0]['key']} for {duration(throttled)} in all"
    return (f"throttled {plural(keys(incident, 'throttled_client'), 'client')} for "
            f"{duration(throttled)} in all, {clients[0]['key']} most "
            f"({duration(clients[0]['value'])})")


def harm(row: dict) -> str:
    """"hurt", "slowed" or "" for a client's p99 during an incident against before it."""
    before, during = row["before_p99_ms"], row["during_p99_ms"]
    if during < before * SLOWER_RATIO or during - before < SLOWER_MS:
        return ""
    return "hurt" if during - before >= HURT_MS else "slowed"


def _slowdown(row: dict) -> float:
    return row["during_p99_ms"] / max(row["before_p99_ms"], 1e-3)


def existing_clients(impact: list[dict], culprits: frozenset[str] = frozenset()) -> str:
    """Whether the clients that were already there got slower: their p99 during the incident
    against the quiet seconds before it (the most slowed one named)."""
    victims = sorted((row for row in impact if row["client_id"] not in culprits),
                     key=lambda row: (-_slowdown(row), row["client_id"]))
    if not victims:
        return ("No client was served both before and during it, so whether existing clients "
                "were hurt cannot be told.")
    worst, others = victims[0], len(victims) - 1
    verdict = harm(worst)
    if not verdict:
        among = (f" (the most slowed of {plural(len(victims), 'existing client')})"
                 if others else "")
        return (f"Existing clients were not hurt: {worst['client_id']}'s p99 latency was "
                f"{duration(worst['during_p99_ms'])} during, against "
                f"{duration(worst['before_p99_ms'])} before{among}.")
    also = sum(1 for row in victims[1:] if harm(row))
    rest = (f", and {also} of {plural(others, 'other existing client')} too" if also else
            f"; {plural(others, 'other existing client')} did not get slower" if others
            else "")
    how = "were hurt" if verdict == "hurt" else "were slowed a little"
    return (f"Existing clients {how}: {worst['client_id']}'s p99 latency rose from "
            f"{duration(worst['before_p99_ms'])} before to {duration(worst['during_p99_ms'])} "
            f"during{rest}.")


def story(incident: dict, impact: list[dict], limits: dict) -> Story:
    """Causes, then what the broker did, then whether existing clients were hurt."""
    found = causes(incident, limits)
    culprits = frozenset(client for cause in found for client in cause.culprits)
    mine = [row for row in impact if row["incident"] == incident["incident"]]
    return Story(number=incident["incident"], start=incident["start"], end=incident["end"],
                 when=span(incident["start"], incident["end"]),
                 title="; ".join(cause.title for cause in found),
                 causes=tuple(cause.sentence for cause in found), action=actions(incident),
                 existing=existing_clients(mine, culprits), culprits=culprits)


# --- the whole run ---------------------------------------------------------------------------

def lede(summary: dict, timeline: list[dict], stories: list[Story]) -> str:
    """The report's first sentence: how many incidents, when, over how much of a log."""
    if not timeline:
        return "The event log holds no readable events."
    first, last = timeline[0]["second"], timeline[-1]["second"]
    covered = (f"{seconds(last - first + 1)} of events from "
               f"{plural(summary.get('brokers') or 1, 'broker')} ({clock(first)}{DASH}"
               f"{clock(last)} UTC, {day(first)})")
    if not stories:
        return f"No incidents in {covered}: nothing passed a threshold."
    return f"{plural(len(stories), 'incident')} in {covered}."


def overall(summary: dict, top: list[dict]) -> list[str]:
    """Sentences about the whole run: latency per plane, unreadable lines, shadow mode."""
    found = []
    planes = [f"the {plane} plane served {plural(summary[f'{plane}_requests'], 'request')} "
              f"with a p99 latency of {duration(summary.get(f'{plane}_p99_ms'))}"
              for plane in ("data", "control") if summary.get(f"{plane}_requests")]
    if planes:
        found.append(f"Over the whole run {listing(planes)}.")
    skipped = (summary.get("bad_lines") or 0) + (summary.get("unknown_version") or 0)
    if skipped:
        found.append(f"{count(skipped)} of {plural(summary['lines'], 'line')} in the event "
                     f"log could not be used ({count(summary.get('bad_lines') or 0)} "
                     f"unreadable, {count(summary.get('unknown_version') or 0)} of an unknown "
                     "version) and were skipped.")
    shadow = _shadow(top)
    if shadow:
        found.append(shadow)
    return found


def _shadow(top: list[dict]) -> str:
    leader = {row["metric"]: row for row in top
              if row["metric"].startswith("shadow_") and row["rank"] == 1}
    parts = []
    if "shadow_rejections" in leader:
        row = leader["shadow_rejections"]
        parts.append(f"refused {row['key']} most ({plural(row['value'], 'connection')})")
    if "shadow_throttle_ms" in leader:
        row = leader["shadow_throttle_ms"]
        parts.append(f"throttled {row['key']} most ({duration(row['value'])})")
    if not parts:
        return ""
    return (f"Limits in shadow mode would have {listing(parts)}; nothing of that was "
            "enforced.")


# --- groups ----------------------------------------------------------------------------------

def reasons(row: dict) -> str:
    """A group's most common rebalance reasons: "member joined (3), session expired (2) and 2
    other reasons"; "" for a group without rebalances."""
    kept = row.get("reasons") or []
    named = [f"{item['reason']} ({count(item['count'])})" for item in kept]
    others = (row.get("reason_kinds") or 0) - len(kept)
    if others > 0:
        named.append(plural(others, "other reason"))
    return listing(named)


def endings(figures: dict) -> str:
    """How acquisitions ended, the kinds that happened: "16 accepted and 1 lock expired";
    "" when none did."""
    return listing([f"{count(figures[key])} {what}" for key, what in ENDINGS
                    if figures.get(key)])


def groups(rows: list[dict]) -> list[str]:
    """Sentences about the groups (rows of pipeline.aggregate.groups, heaviest first): how
    many of which type, their rebalances, and what share groups did with their records.
    Nothing when the log holds no group events."""
    if not rows:
        return []
    every, totals = rows[0]["groups"], rows[0]["totals"]
    kinds = [f"{count(n)} {kind}" for kind, n in sorted((rows[0].get("types") or {}).items())]
    listed = (f", the {count(len(rows))} with the most rebalances and redeliveries listed"
              if every > len(rows) else "")
    found = [f"{plural(every, 'group')} in the event log ({listing(kinds)}){listed}."]
    if totals.get("rebalances"):
        found.append(f"Groups rebalanced {plural(totals['rebalances'], 'time')} in all.")
    if totals.get("acquired"):
        ended = endings(totals)
        found.append(f"Share groups acquired {plural(totals['acquired'], 'record')}, "
                     f"{count(totals.get('redelivered') or 0)} of them redelivered "
                     f"({percent((totals.get('redelivered') or 0) / totals['acquired'])})"
                     + (f"; acquisitions ended {ended}." if ended else "."))
    return found


def heaviest(row: dict) -> str:
    """The heaviest group in a line: "orders (classic: 7 rebalances)"."""
    figures = []
    if row.get("rebalances") is not None:
        figures.append(plural(row["rebalances"], "rebalance"))
    if row.get("acquired") is not None:
        figures.append(f"{count(row.get('redelivered') or 0)} of "
                       f"{plural(row['acquired'], 'record')} redelivered")
    return f"{row['group']} ({row['group_type']}: {', '.join(figures)})"
