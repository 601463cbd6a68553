"""Who may publish and subscribe where: a topic's policy against the caller. Pure Python.

A policy names the groups whose members may publish and subscribe, and whether callers without
credentials may; both are inherited down the tree (topics.tree.Policy). Members of hpwsn-admins
may do anything. Anything an anonymous caller may do, an authenticated one may do too.

Subscriptions and pull points belong to the principal that made them (Principal.owner): only the
owner, admins and operators may act on them (may_act_on), the one rule every edge reaches through
subscriptions.services.subscription_authorize / pull_point_authorize.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hpwsn import errors, topicexpr
from hpwsn.topicexpr import TopicExpression
from topics.tree import ROOT_POLICY, Policy, TopicNode, TopicTree

ADMIN_GROUP = "hpwsn-admins"
OPERATOR_GROUP = "hpwsn-operators"
# What a subscription or pull point made by a caller without credentials is owned by.
ANONYMOUS_OWNER = "anonymous"
ANY_USER = "*"  # in a group list: every authenticated principal


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: a directory user with its groups, or nobody (anonymous)."""

    name: str | None = None
    groups: frozenset[str] = field(default_factory=frozenset)  # case-folded group names
    method: str = ""  # how it was authenticated: wsse-text, wsse-digest, basic

    @property
    def anonymous(self) -> bool:
        return self.name is None

    @property
    def is_admin(self) -> bool:
        return ADMIN_GROUP in self.groups

    @property
    def is_operator(self) -> bool:
        """Admins and operators: they may act on any subscription or pull point."""
        return ADMIN_GROUP in self.groups or OPERATOR_GROUP in self.groups

    @property
    def owner(self) -> str:
        """The owner recorded on what this principal creates (see may_act_on)."""
        return ANONYMOUS_OWNER if self.name is None else owner_of_user(self.name)

    def __str__(self) -> str:
        return "anonymous caller" if self.name is None else f"user '{self.name}'"


ANONYMOUS = Principal()


def owner_of_user(name: str) -> str:
    """The owner value of a directory user: `user:<uid>`.

    The prefix keeps a person whose uid happens to be "anonymous" from owning what anonymous
    callers made. The uid is the one the directory returned (canonical spelling), not the one
    the caller typed.
    """
    return f"user:{name}"


def owner_label(owner: str) -> str:
    """How an owner is shown: the uid, or "anonymous"."""
    return owner.removeprefix("user:")


def may_act_on(principal: Principal, owner: str) -> bool:
    """Whether the principal may act on a subscription or pull point this owner created.

    The owner may, and so may admins and operators. What an anonymous caller created, any caller
    may act on (anything an anonymous caller may do, an authenticated one may do too). Owners
    compare without case, as the directory compares uids: a web login typed `Alice` is the
    person the directory spells `alice`.
    """
    return (
        owner.casefold() in (ANONYMOUS_OWNER, principal.owner.casefold()) or principal.is_operator
    )


def check_owner(principal: Principal, *, owner: str, operation: str, resource: str) -> None:
    """Raise NotAuthorized unless the principal may do `operation` on `resource` (may_act_on)."""
    if may_act_on(principal, owner):
        return
    hint = "; authenticate as its owner" if principal.anonymous else ""
    raise errors.NotAuthorized(
        f"{principal} may not {operation} '{resource}': it belongs to another principal{hint}",
        detail_xml=errors.not_authorized_xml(
            principal.name, operation, resource, element="Resource"
        ),
    )


def split_groups(text: str) -> tuple[str, ...]:
    """Group names of a comma separated list, case-folded (LDAP compares cn case-insensitively)."""
    return tuple(sorted({g.strip().casefold() for g in text.split(",") if g.strip()}))


def _allowed(groups: tuple[str, ...], anonymous_ok: bool, principal: Principal) -> bool:
    if anonymous_ok or principal.is_admin:
        return True
    if principal.name is None:
        return False
    return ANY_USER in groups or not principal.groups.isdisjoint(groups)


def may_publish(policy: Policy, principal: Principal) -> bool:
    return _allowed(policy.publish_groups, policy.anonymous_publish, principal)


def may_subscribe(policy: Policy, principal: Principal) -> bool:
    return _allowed(policy.subscribe_groups, policy.anonymous_subscribe, principal)


def _denied(principal: Principal, operation: str, topic: str) -> errors.NotAuthorized:
    hint = "; authenticate with a wsse:UsernameToken or HTTP Basic" if principal.anonymous else ""
    return errors.NotAuthorized(
        f"{principal} may not {operation} on topic '{topic}'{hint}",
        detail_xml=errors.not_authorized_xml(principal.name, operation, topic),
    )


def check_publish(policy: Policy, principal: Principal, topic_path: str) -> None:
    """Raise NotAuthorized unless the principal may publish on a topic with this policy."""
    if not may_publish(policy, principal):
        raise _denied(principal, "publish", topic_path)


def check_subscribe(policy: Policy, principal: Principal, topic_path: str) -> None:
    """Raise NotAuthorized unless the principal may subscribe to a topic with this policy."""
    if not may_subscribe(policy, principal):
        raise _denied(principal, "subscribe", topic_path)


def _anchor(tree: TopicTree, pattern: topicexpr.PathPattern) -> TopicNode | None:
    """The deepest existing topic named by the pattern's leading plain steps (ALL in ALL//*)."""
    names: list[str] = []
    for step in pattern.steps:
        if step.descendant or step.name in (topicexpr.ANY, topicexpr.SELF):
            break
        names.append(step.name)
    root_ns = pattern.steps[0].namespace
    for k in range(len(names), 0, -1):
        node = tree.resolve(root_ns, tuple(names[:k]), pattern.any_namespace)
        if node is not None:
            return node
    return None


def check_subscribe_expression(
    tree: TopicTree, expression: TopicExpression | None, principal: Principal
) -> None:
    """Raise NotAuthorized unless the principal may subscribe to everything the expression covers.

    A subscription covers whole subtrees, so every existing topic it covers must allow the
    principal, not only the one it names. Topics that do not exist yet are judged by where they
    would appear: each alternative of the expression must be allowed at its concrete prefix
    (ALL for ALL//*), or at the top of the tree when it has none (//*, *, no filter at all).
    """
    if principal.is_admin:
        return
    patterns = expression.patterns if expression is not None else ()
    text = expression.text if expression is not None else "*"
    if not patterns:
        check_subscribe(ROOT_POLICY, principal, text)
    for pattern in patterns:
        anchor = _anchor(tree, pattern)
        if anchor is None:
            check_subscribe(ROOT_POLICY, principal, text)
        else:
            check_subscribe(anchor.policy, principal, anchor.path)
    for node in tree.by_names.values():
        if may_subscribe(node.policy, principal):
            continue
        if expression is None or expression.covers(node.root_namespace, node.names):
            raise _denied(principal, "subscribe", node.path)
