"""The ACLs' owner: CreateAcls, DescribeAcls and DeleteAcls, and where the ACLs are kept.

`AclStore` keeps them in `<first log dir>/.pybroker-acls.json`, written atomically (a
temporary file, fsync, rename) before a change is acknowledged, and read back at start-up.
The parent is its only writer.  After every change `on_change` sends them to every worker
(IPC `Acls`), which decides requests with them from then on: within one loop turn of the
parent, well inside Kafka's usual "eventually".

`AclService` answers the three APIs as Kafka's AclApis does: without an authorizer, each
gets SECURITY_DISABLED; DescribeAcls needs DESCRIBE on the cluster, CreateAcls and DeleteAcls
ALTER (else CLUSTER_AUTHORIZATION_FAILED); each creation is validated on its own
(INVALID_REQUEST naming what is wrong); a DeleteAcls filter removes every ACL it matches and
lists them.
"""

from __future__ import annotations

import logging
import os

import msgspec

from broker.parent.forwarded import ResponseBudget, budget_of
from broker.shared.access import Access
from broker.shared.acl import (CLUSTER_NAME, MAX_ACL_BYTES, MAX_ACLS, Acl, AclFilter, Operation,
                               ResourceType, acl_bytes, canonical_host, creation_problem)
from broker.shared.protocol.context import NO_THROTTLE, RequestContext, error_code
from broker.shared.protocol.errors import ErrorCode

log = logging.getLogger("broker.parent.acl_store")

STORE_FILE = ".pybroker-acls.json"
_DISABLED = "No Authorizer is configured on the broker"


class AclStore:
    def __init__(self, directory: str):
        self.path = os.path.join(directory, STORE_FILE)
        self.acls: tuple[Acl, ...] = ()

    def load(self) -> None:
        try:
            with open(self.path, "rb") as handle:
                self.acls = tuple(msgspec.json.decode(handle.read(), type=list[Acl]))
        except FileNotFoundError:
            self.acls = ()

    def save(self, acls: tuple[Acl, ...]) -> None:
        temporary = self.path + ".tmp"
        with open(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as handle:
            handle.write(msgspec.json.encode(list(acls)))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self.path)
        self.acls = acls


class AclService:
    def __init__(self, store: AclStore, access: Access, on_change=lambda: None):
        self.store = store
        self.access = access  # the parent's: checks the asker, and holds the ACLs in force
        self.on_change = on_change  # after a change was persisted: tell the workers

    # --- DescribeAcls ---------------------------------------------------------------------

    def describe(self, ctx: RequestContext, body, _who: str,
                 budget: ResponseBudget | None = None) -> bytes:
        answer = {"throttle_time": NO_THROTTLE, "error_code": ErrorCode.none,
                  "error_message": None, "resources": []}
        refusal = self._refusal(ctx, Operation.DESCRIBE)
        wanted = _filter(body, body.resource_type_filter, body.resource_name_filter,
                         body.pattern_type_filter)
        problem = refusal or (None if wanted.problem() is None
                              else ("invalid_request", wanted.problem()))
        if problem is not None:
            return ctx.respond(dict(answer, error_code=error_code(problem[0]),
                                    error_message=problem[1]))
        resources: dict[tuple, list] = {}
        budget = budget or budget_of()
        for acl in self.store.acls:
            if wanted.matches(acl):
                budget.charge(_acl_bytes(acl))
                resources.setdefault((acl.resource_type, acl.resource_name, acl.pattern_type),
                                     []).append({"principal": acl.principal, "host": acl.host,
                                                 "operation": acl.operation,
                                                 "permission_type": acl.permission})
        answer["resources"] = [{"resource_type": kind, "resource_name": name,
                                "pattern_type": pattern, "acls": acls}
                               for (kind, name, pattern), acls in resources.items()]
        return ctx.respond(answer)

    # --- CreateAcls -----------------------------------------------------------------------

    def create(self, ctx: RequestContext, body, who: str) -> bytes:
        refusal = self._refusal(ctx, Operation.ALTER)
        if refusal is not None:
            return ctx.respond({"throttle_time": NO_THROTTLE, "results": [
                {"error_code": error_code(refusal[0]), "error_message": refusal[1]}
                for _ in body.creations]})
        acls, known = list(self.store.acls), set(self.store.acls)
        weight = sum(map(acl_bytes, acls))
        results = []
        for creation in body.creations:
            acl = Acl(creation.resource_type, creation.resource_name,
                      creation.resource_pattern_type, creation.principal,
                      canonical_host(creation.host), creation.operation,
                      creation.permission_type)
            problem = creation_problem(acl)
            if problem is None and acl not in known and (
                    len(acls) >= MAX_ACLS or weight + acl_bytes(acl) > MAX_ACL_BYTES):
                problem = f"{MAX_ACLS} ACLs or {MAX_ACL_BYTES} bytes of them are stored " \
                          f"already (the most kept)"
            if problem is not None:
                results.append({"error_code": ErrorCode.invalid_request,
                                "error_message": problem})
                continue
            if acl not in known:  # creating an ACL that exists is a success that changes nothing
                known.add(acl)
                acls.append(acl)
                weight += acl_bytes(acl)
            results.append({"error_code": ErrorCode.none, "error_message": None})
        failure = self._commit(tuple(acls), who, "created")
        if failure is not None:
            results = [result if result["error_code"] != ErrorCode.none else failure
                       for result in results]
        return ctx.respond({"throttle_time": NO_THROTTLE, "results": results})

    # --- DeleteAcls -----------------------------------------------------------------------

    def delete(self, ctx: RequestContext, body, who: str,
               budget: ResponseBudget | None = None) -> bytes:
        """Each filter against the ACLs as they were (as Kafka), each lists what it matched;
        a filter given more than once is matched once."""
        refusal = self._refusal(ctx, Operation.ALTER)
        if refusal is not None:
            return ctx.respond({"throttle_time": NO_THROTTLE, "filter_results": [
                {"error_code": error_code(refusal[0]), "error_message": refusal[1],
                 "matching_acls": []} for _ in body.filters]})
        doomed: set[Acl] = set()
        results = []
        budget = budget or budget_of()
        matched: dict[AclFilter, list[Acl]] = {}
        for item in body.filters:
            wanted = _filter(item, item.resource_type_filter, item.resource_name_filter,
                             item.pattern_type_filter)
            if wanted.problem() is not None:
                results.append({"error_code": ErrorCode.invalid_request,
                                "error_message": wanted.problem(), "matching_acls": []})
                continue
            if wanted not in matched:
                matched[wanted] = [acl for acl in self.store.acls if wanted.matches(acl)]
            matching = matched[wanted]
            budget.charge(sum(map(_acl_bytes, matching)), len(matching) + 1)
            doomed.update(matching)
            results.append({"error_code": ErrorCode.none, "error_message": None,
                            "matching_acls": [_matching(acl) for acl in matching]})
        failure = self._commit(tuple(acl for acl in self.store.acls if acl not in doomed),
                               who, "deleted")
        if failure is not None:
            results = [dict(failure, matching_acls=[]) if result["error_code"] == ErrorCode.none
                       else result for result in results]
        return ctx.respond({"throttle_time": NO_THROTTLE, "filter_results": results})

    # --- shared ---------------------------------------------------------------------------

    def _refusal(self, ctx: RequestContext, operation: Operation) -> tuple[str, str] | None:
        if not self.access.enabled:
            return "security_disabled", _DISABLED
        if not self.access.check(ctx, operation, ResourceType.CLUSTER, CLUSTER_NAME):
            return "cluster_authorization_failed", \
                f"{operation.name} on the cluster is required to manage ACLs"
        return None

    def _commit(self, acls: tuple[Acl, ...], who: str, verb: str) -> dict | None:
        """Persist, then apply; the answer of every success instead if the write failed."""
        if acls == self.store.acls:
            return None
        before = len(self.store.acls)
        try:
            self.store.save(acls)
        except OSError as error:
            log.error("ACLs could not be written (%s): nothing changed", error)
            return {"error_code": ErrorCode.unknown_server_error,
                    "error_message": f"the ACLs could not be written: {error.strerror}"}
        self.access.update(acls)
        log.info("ACLs %s by %s: %d now (%+d)", verb, who or "a client", len(acls),
                 len(acls) - before)
        self.on_change()
        return None


def _filter(item, resource_type: int, resource_name, pattern_type: int) -> AclFilter:
    host = None if item.host_filter is None else canonical_host(item.host_filter)
    return AclFilter(resource_type, resource_name, pattern_type, item.principal_filter, host,
                     item.operation, item.permission_type)


def _acl_bytes(acl: Acl) -> int:
    """About what an ACL takes in an answer (its names; ENTRY_BYTES covers the rest)."""
    return len(acl.resource_name) + len(acl.principal) + len(acl.host)


def _matching(acl: Acl) -> dict:
    return {"error_code": ErrorCode.none, "error_message": None,
            "resource_type": acl.resource_type, "resource_name": acl.resource_name,
            "pattern_type": acl.pattern_type, "principal": acl.principal, "host": acl.host,
            "operation": acl.operation, "permission_type": acl.permission}
