"""Who did it: the identity the platform verified, recorded with every write to the audit trail.

Strongest source first:

- ``auth-proxy``: a run launched from the Dagster UI behind the chart's authenticating proxy
  (oauth2-proxy). The proxy signs the user in, removes any identity header the client sent and
  sets its own; the run coordinator in the webserver (pipelines/run_coordinator.py) copies that
  header onto the run as tags when the run is submitted. Only the proxy can reach the webserver
  (the chart's NetworkPolicy), so the header is the proxy's.
- ``lakefs``: the lakeFS user behind the store's credentials. lakeFS authenticates every request;
  ``GET /api/v1/user`` names the user the key belongs to.
- ``os-user``: the operating-system user of the process. Nothing authenticates it, and the record
  says so.

A name typed on the command line (``--by``) is a note shown beside the identity, never the identity.

Dagster-free: the coordinator and the ops hand in headers, run tags and the store.
"""

from __future__ import annotations

import getpass
import socket
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Protocol

AUTH_PROXY = "auth-proxy"
LAKEFS = "lakefs"
OS_USER = "os-user"
METHODS = (AUTH_PROXY, LAKEFS, OS_USER)

# The headers oauth2-proxy sets on requests to its upstream with --pass-user-headers. It deletes
# any header of these names the client sent before setting its own (its request header injector
# strips every header it injects), so behind it they cannot be forged. X-Auth-Request-* are only
# response headers for nginx's auth_request: a client's copy would pass through untouched.
PROXY_IDENTITY_HEADERS = ("X-Forwarded-Email", "X-Forwarded-User", "X-Forwarded-Preferred-Username")
DEFAULT_IDENTITY_HEADER = "X-Forwarded-Email"
MAX_IDENTITY_CHARS = 254  # an e-mail address's longest form

# Run tags the run coordinator writes on every run it submits (and overwrites if a client set them).
LAUNCHED_BY_TAG = "platform/launched_by"
LAUNCH_VERIFIED_TAG = "platform/launched_by_verified"  # AUTH_PROXY or NOT_VERIFIED
LAUNCH_RUN_TAG = "platform/launched_by_run"  # the run whose submission carried the header
NOT_VERIFIED = "none"
NOBODY_VERIFIED = "not verified"  # LAUNCHED_BY_TAG of a run nobody verified (the UI shows the tag)
PARENT_RUN_TAG = "dagster/parent_run_id"


class IdentityRefused(PermissionError):
    """An identity that cannot be verified where it was presented; the message says what to fix."""


@dataclass(frozen=True)
class Actor:
    """A verified (or plainly unverified) identity, as recorded in the audit trail."""

    user: str
    verified_by: str  # one of METHODS
    authenticated: bool
    detail: str  # how it was verified, in words
    # The lakeFS user whose key wrote the record, when the actor is someone else (a UI user).
    store_user: str | None = None

    def __post_init__(self):
        if self.verified_by not in METHODS:
            raise ValueError(f"unknown identity source {self.verified_by!r}; use one of {', '.join(METHODS)}")
        if not self.user:
            raise ValueError("an actor needs a user name")

    def to_record(self) -> dict:
        record = {"user": self.user, "verified_by": self.verified_by, "authenticated": self.authenticated,
                  "detail": self.detail}
        if self.store_user is not None:
            record["store_user"] = self.store_user
        return record

    def describe(self) -> str:
        return describe_actor(self.to_record())


def describe_actor(record: Mapping) -> str:
    """``alice@example.com (signed in through the authenticating proxy)`` and the like."""
    how = {
        AUTH_PROXY: "signed in through the authenticating proxy",
        LAKEFS: "lakeFS user, authenticated by lakeFS",
        OS_USER: "OS user, not authenticated",
    }.get(record.get("verified_by"), f"verified by {record.get('verified_by')!r}")
    store_user = record.get("store_user")
    if store_user and store_user != record["user"]:
        how += f"; written with lakeFS user {store_user}'s key"
    return f"{record['user']} ({how})"


def audit_fields(actor: Actor, note: str | None) -> dict:
    """What every audit entry carries: ``by`` (the verified user), ``actor`` (how) and ``note``."""
    if not isinstance(actor, Actor):
        raise TypeError(
            f"the audit trail records a verified core.identity.Actor, not {type(actor).__name__} {actor!r}: "
            "resolve it with core.identity.resolve_actor(store); a typed name belongs in note=...")
    return {"by": actor.user, "actor": actor.to_record(), "note": note or None}


def describe_entry(entry: Mapping, by_key: str = "by") -> str:
    """The identity of an audit entry in words, with its note. Entries written before identities
    were verified hold only the typed name, and say so."""
    if "actor" in entry:
        text = describe_actor(entry["actor"])
    else:
        text = f"{entry.get(by_key)} (self-declared: recorded before identities were verified)"
    note = entry.get("note")
    return f'{text}, note "{note}"' if note else text


# --- where an identity comes from ----------------------------------------------------------------------

class AuthenticatingStore(Protocol):
    def authenticated_user(self): ...


def os_actor() -> Actor:
    """The OS user of this process: recorded, never authenticated."""
    return Actor(user=getpass.getuser(), verified_by=OS_USER, authenticated=False,
                 detail=f"OS user of the process on {socket.gethostname()}; nothing authenticates it")


def store_actor(store: AuthenticatingStore) -> Actor | None:
    """The user the store authenticated its credentials as (lakeFS), or None (a local directory)."""
    who = store.authenticated_user()
    if who is None:
        return None
    return Actor(user=who.id, verified_by=LAKEFS, authenticated=True, detail=who.detail)


def resolve_actor(store: AuthenticatingStore, launcher: Actor | None = None) -> Actor:
    """Who writes to the audit trail now: the verified UI user who launched the run (``launcher``),
    else the store's authenticated user, else the OS user (not authenticated)."""
    writer = store_actor(store)
    if launcher is not None:
        return replace(launcher, store_user=writer.user if writer else None)
    return writer or os_actor()


# --- the proxy's header, at the webserver --------------------------------------------------------------

def check_identity_header(name: str) -> str:
    """The header name a deployment trusts must be one the proxy strips from clients and sets itself."""
    for known in PROXY_IDENTITY_HEADERS:
        if name.lower() == known.lower():
            return known
    raise ValueError(
        f"identity header {name!r} is not one the chart's oauth2-proxy sets on every request and removes from "
        f"the client's: a client could send it through the proxy unchanged. Use one of "
        f"{', '.join(PROXY_IDENTITY_HEADERS)}")


def identity_from_header(value: str | None, *, header: str, trusted: bool) -> Actor | None:
    """The user the proxy's header names on a request to the webserver.

    ``trusted`` says this deployment sits behind the authenticating proxy. Then a request without
    the header went around the proxy and is refused. Without the proxy, a request that carries
    the header is refused too: nothing in front removed a client's copy, so it proves nothing.
    Neither header nor proxy: None (the run is recorded as not verified).
    """
    present = value is not None and value.strip() != ""
    if not trusted:
        if present:
            raise IdentityRefused(
                f"refused: the request carries the identity header {header} but this Dagster instance is not "
                "configured behind the authenticating proxy (run coordinator trust_identity_header: false), so "
                "nothing removed a client's copy and it cannot be verified. Send the request without it, or "
                "deploy the chart's auth proxy and set trust_identity_header: true")
        return None
    if not present:
        raise IdentityRefused(
            f"refused: the request carries no {header} header, so it did not come through the authenticating "
            "proxy that signs users in (helm/model-factory authProxy); open the Dagster UI through the proxy's "
            "address, not the webserver's")
    user = value.strip()
    if "," in user or len(user) > MAX_IDENTITY_CHARS or not user.isprintable():
        raise IdentityRefused(
            f"refused: the {header} header {user[:60]!r} is not one identity (several values, or unprintable "
            "characters); the proxy sets exactly one")
    return Actor(user=user, verified_by=AUTH_PROXY, authenticated=True,
                 detail=f"{header} set by the authenticating proxy on the launch request, "
                        "tagged on the run by the run coordinator")


# --- the identity on a run's tags ----------------------------------------------------------------------

def launch_identity_tags(actor: Actor | None, run_id: str) -> dict[str, str]:
    """The tags a submitted run gets: who launched it, or that nobody was verified. Written on
    every submission, so a client's own values for these tags never survive."""
    if actor is None:
        return {LAUNCHED_BY_TAG: NOBODY_VERIFIED, LAUNCH_VERIFIED_TAG: NOT_VERIFIED, LAUNCH_RUN_TAG: run_id}
    return {LAUNCHED_BY_TAG: actor.user, LAUNCH_VERIFIED_TAG: actor.verified_by, LAUNCH_RUN_TAG: run_id}


def inherited_identity_tags(run_id: str, tags: Mapping[str, str],
                            parent_tags: Mapping[str, str] | None) -> dict[str, str]:
    """For a run the daemon submits (schedule, sensor, backfill, retry): a retry keeps the identity
    its parent run was submitted with, when its tags still say the same; anything else is not verified."""
    keys = (LAUNCHED_BY_TAG, LAUNCH_VERIFIED_TAG, LAUNCH_RUN_TAG)
    if (parent_tags is not None and parent_tags.get(LAUNCH_VERIFIED_TAG) == AUTH_PROXY
            and all(tags.get(k) == parent_tags.get(k) for k in keys)):
        return {k: parent_tags[k] for k in keys}
    return launch_identity_tags(None, run_id)


def launcher_from_tags(tags: Mapping[str, str], *, coordinator_verifies: bool) -> Actor | None:
    """The verified user who launched a run, from its tags, or None.

    Trusted only where the instance's run coordinator is the one that writes these tags on every
    submission (``coordinator_verifies``); elsewhere anyone may type them into the launchpad.
    """
    if not coordinator_verifies or tags.get(LAUNCH_VERIFIED_TAG) != AUTH_PROXY or not tags.get(LAUNCHED_BY_TAG):
        return None
    return Actor(user=tags[LAUNCHED_BY_TAG], verified_by=AUTH_PROXY, authenticated=True,
                 detail=f"launched from the Dagster UI; the authenticating proxy's header was tagged on run "
                        f"{tags.get(LAUNCH_RUN_TAG, '?')} by the run coordinator")
