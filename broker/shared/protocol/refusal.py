"""Changes refused on a data listener when a control plane exists (KIP-291).

IncrementalAlterConfigs, AlterClientQuotas, AlterUserScramCredentials, CreateAcls and
DeleteAcls sent there get CLUSTER_AUTHORIZATION_FAILED for every resource, entry, user,
creation or filter, whatever the ACLs say.  A worker answers them itself, so the parent's loop never queues a
refused request; the parent's admin service answers the same way should one reach it.
"""

from __future__ import annotations

from broker.shared.protocol.codec import REQUEST_PREFIX, request_readers
from broker.shared.protocol.context import NO_THROTTLE, RequestContext, error_code

CODE = "cluster_authorization_failed"
MESSAGE = "changes are served on the control-plane listener only"


def refused_alter_configs(ctx: RequestContext, body) -> bytes:
    return ctx.respond({"throttle_time": NO_THROTTLE, "responses": [
        {"resource_type": resource.resource_type, "resource_name": resource.resource_name,
         "error_code": error_code(CODE), "error_message": MESSAGE}
        for resource in body.resources]})


def refused_alter_quotas(ctx: RequestContext, body) -> bytes:
    return ctx.respond({"throttle_time": NO_THROTTLE, "entries": [
        {"error_code": error_code(CODE), "error_message": MESSAGE,
         "entity": [{"entity_type": e.entity_type, "entity_name": e.entity_name}
                    for e in entry.entity]} for entry in body.entries]})


def refused_alter_scram(ctx: RequestContext, body) -> bytes:
    names = dict.fromkeys(item.name for item in (*body.deletions, *body.upsertions))
    return ctx.respond({"throttle_time": NO_THROTTLE, "results": [
        {"user": name, "error_code": error_code(CODE), "error_message": MESSAGE}
        for name in names]})


def refused_create_acls(ctx: RequestContext, body) -> bytes:
    return ctx.respond({"throttle_time": NO_THROTTLE, "results": [
        {"error_code": error_code(CODE), "error_message": MESSAGE} for _ in body.creations]})


def refused_delete_acls(ctx: RequestContext, body) -> bytes:
    return ctx.respond({"throttle_time": NO_THROTTLE, "filter_results": [
        {"error_code": error_code(CODE), "error_message": MESSAGE, "matching_acls": []}
        for _ in body.filters]})


_REFUSALS = {44: refused_alter_configs, 33: refused_alter_configs, 49: refused_alter_quotas, 51: refused_alter_scram,
             30: refused_create_acls, 31: refused_delete_acls}


def refuse_change(request: bytes, listener: int) -> bytes:
    """The whole refusal of one IncrementalAlterConfigs or AlterClientQuotas frame."""
    api_key, version, _ = REQUEST_PREFIX.unpack_from(request, 0)
    header_reader, body_reader = request_readers(api_key, version)
    header, offset = header_reader(request, 0)
    body, _ = body_reader(request, offset)
    ctx = RequestContext(request[4:8], api_key, version, listener, header)
    return _REFUSALS[api_key](ctx, body)
