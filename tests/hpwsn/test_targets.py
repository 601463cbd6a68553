import pytest

from hpwsn.targets import TargetPolicy, TargetRefused


def resolver(table: dict[str, list[str]]):
    def resolve(host: str, port: int) -> list[str]:
        if host not in table:
            raise TargetRefused(f"host '{host}' does not resolve")
        return table[host]

    return resolve


DNS = resolver(
    {
        "consumer.example.com": ["203.0.113.7"],
        "rebind.example.com": ["169.254.169.254"],
        "mixed.example.com": ["127.0.0.1", "10.0.0.8"],
        "localhost": ["127.0.0.1", "::1"],
    }
)


def test_loopback_is_allowed_by_default():
    policy = TargetPolicy(resolver=DNS)
    assert policy.check("http://127.0.0.1:9000/c").addresses == ("127.0.0.1",)
    assert policy.check("http://[::1]:9000/c").port == 9000
    assert policy.check("http://localhost/c").addresses == ("127.0.0.1", "::1")


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://169.254.169.254/latest/meta-data/", "always refused"),
        ("http://[fe80::1]/", "always refused"),
        ("http://[::ffff:169.254.169.254]/", "always refused"),
        ("http://rebind.example.com/", "always refused"),
        ("http://10.0.0.5/", "outside the push allow-list"),
        ("http://consumer.example.com/", "outside the push allow-list"),
        ("http://mixed.example.com/", "10.0.0.8"),
        ("ftp://127.0.0.1/", "is not an http"),
        ("http://nowhere.invalid/", "does not resolve"),
        ("http://127.0.0.1:99999/", "invalid port"),
    ],
)
def test_it_refuses_targets_outside_the_policy_and_says_why(url, reason):
    with pytest.raises(TargetRefused, match=reason):
        TargetPolicy(resolver=DNS).check(url)


def test_networks_names_and_suffixes_extend_the_allow_list():
    policy = TargetPolicy(["10.0.0.0/8", ".example.com", "127.0.0.1/32"], resolver=DNS)
    assert policy.check("http://10.0.0.5/").addresses == ("10.0.0.5",)
    assert policy.check("https://consumer.example.com/").port == 443
    assert policy.check("http://mixed.example.com/")  # allowed by name
    with pytest.raises(TargetRefused, match="always refused"):
        policy.check("http://rebind.example.com/")  # a name never unlocks metadata addresses


def test_a_star_allows_every_routable_address_but_never_metadata():
    policy = TargetPolicy(["*"], resolver=DNS)
    assert policy.check("http://consumer.example.com/")
    with pytest.raises(TargetRefused):
        policy.check("http://169.254.169.254/")
