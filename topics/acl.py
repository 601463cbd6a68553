"""Who may publish and subscribe where: a topic's policy against the caller. Pure Python.

A policy names the groups whose members may publish and subscribe, and whether callers without
credentials may; both are inherited down the tree (topics.tree.Policy). Members of hpwsn-admins
may do anything. Anything an anonymous caller may do, an authenticated one may do too.

Subscriptions and pull points belong to the principal that made them (Principal.owner): only the
owner, admins and operators may act on them (may_act_on), the one rule every edge reaches through
subscriptions.services.subscription_authorize / pull_point_authorize.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from hpwsn import errors, topicexpr
from hpwsn.topicexpr import TopicExpression
from topics import trie
from topics.tree import ROOT_POLICY, Policy, TopicTree

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

    def publisher(self, client: str) -> str:
        """Whose a publication's keys are (its idempotency key, its fragments' Identification):
        the principal's, or an anonymous caller's client address (hpwsn_site.clients), so that
        one caller's keys never meet another's."""
        return self.name if self.name is not None else f"@{client}"

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


def directory_groups(cns: Iterable[str]) -> frozenset[str]:
    """The groups of a person, from the cn of each directory group that lists them."""
    # A cn holding a comma is no group a topic can name (its lists are comma separated); read
    # as a list it would grant the groups it spells ("night-shift, hpwsn-admins").
    return frozenset(split_groups(",".join(cn for cn in cns if "," not in cn)))


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


def check_subscribe_expression(
    tree: TopicTree, expression: TopicExpression | None, principal: Principal
) -> None:
    """Raise NotAuthorized unless the principal may subscribe to everything the expression covers.

    A subscription covers whole subtrees, so every existing topic it covers must allow the
    principal, not only the one it names. Topics that do not exist yet are judged by where they
    would appear: a topic created later takes the rule of its nearest existing ancestor (the top
    of the tree's for a new root), so an expression that may select a child not yet created must
    be allowed where that child would hang (ALL for ALL//*; the top of the tree for //*, *, or no
    filter at all).

    The check walks the expression over the tree (topics/trie.py) and looks only at the topics
    its plain steps name and at the subtrees where the rule changes (TopicTree.marked): below
    any other topic every descendant has that topic's rule. Its cost grows with the expression
    and the number of rule boundaries it meets, not with the size of the tree.
    """
    if principal.is_admin:
        return
    text = expression.text if expression is not None else "*"
    if expression is None:
        if not may_subscribe(ROOT_POLICY, principal):
            raise _denied(principal, "subscribe", text)
        for root in tree.marked(()):
            _check_subtree(tree, (root,), principal)
        return
    for pattern in expression.patterns:
        _check_pattern(tree, pattern, principal, text)


def _check_subtree(tree: TopicTree, names: tuple[str, ...], principal: Principal) -> None:
    """Every topic of the subtree: its top's rule and that of each boundary below it."""
    stack = [names]
    while stack:
        at = stack.pop()
        node = tree.by_names[at]
        if not may_subscribe(node.policy, principal):
            raise _denied(principal, "subscribe", node.path)
        stack.extend((*at, kid) for kid in tree.marked(at))


def _check_pattern(
    tree: TopicTree, pattern: topicexpr.PathPattern, principal: Principal, text: str
) -> None:
    steps = pattern.steps
    stack: list[tuple[tuple[str, ...], frozenset[int]]] = [((), trie.steps_start(pattern))]
    while stack:
        names, states = stack.pop()
        node = tree.by_names.get(names) if names else None
        if names and trie.steps_accept(pattern, states):
            _check_subtree(tree, names, principal)  # it covers this topic and all below
            continue
        named: set[str] = set()
        wild = False
        for si in states:
            if si == len(steps):
                continue
            step = steps[si]
            if step.descendant or step.name in (topicexpr.ANY, topicexpr.SELF):
                wild = True
            else:
                named.add(step.name)
        children = tree.children(names)
        # Unmarked children share this topic's rule all the way down: judged here, not visited.
        visit = [n for n in named if n in children]
        if wild:
            visit.extend(n for n in tree.marked(names) if n not in named)
        reached: set[str] = set()
        for name in visit:
            child = (*names, name)
            root_ns = tree.by_names[child].root_namespace
            after = trie.steps_advance(pattern, states, name, len(names), root_ns)
            if after:
                reached.add(name)
                stack.append((child, after))
        # Whether the expression may select a topic here that has this topic's rule: a wildcard
        # step (any child, existing or created later), or a named child that does not exist.
        if (wild or not named <= reached) and not may_subscribe(
            node.policy if node is not None else ROOT_POLICY, principal
        ):
            raise _denied(principal, "subscribe", node.path if node is not None else text)
