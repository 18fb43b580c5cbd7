"""What a what-if found: per setting, hit tokens beside the oracle and the bound under its
memory, and how far that is from what ran."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class SettingResult:
    """One setting's replay: `hits` per request in arrival order (pins left out)."""

    label: str
    changes: dict  # the fields the setting set (`WhatIfSetting.changes`)
    config: dict  # the cache config it ran with, every field
    num_prompt_tokens: int
    hit_tokens: int
    oracle_tokens: int  # what no memory limit and perfect foresight would hit
    bound_tokens: int  # what the offline policy hits in this setting's memory
    hits: list[int] = field(default_factory=list)
    # of `hit_tokens`, those past the device's own hit that host memory or the disk served
    # (a load counts whole to the farthest tier it read from; docs/rules.md section 16)
    host_hit_tokens: int = 0
    disk_hit_tokens: int = 0
    tier_hits: list[list[int]] = field(default_factory=list)  # per request: [host, disk]
    # the pins this setting could not place ({"pin": its name, "reason"}): it ran without them
    pins_not_placed: list[dict] = field(default_factory=list)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.num_prompt_tokens if self.num_prompt_tokens else 0.0

    @property
    def device_hit_tokens(self) -> int:
        return self.hit_tokens - self.host_hit_tokens - self.disk_hit_tokens

    @property
    def share_of_oracle(self) -> float:
        return self.hit_tokens / self.oracle_tokens if self.oracle_tokens else 1.0

    @property
    def share_of_bound(self) -> float:
        return self.hit_tokens / self.bound_tokens if self.bound_tokens else 1.0

    def as_dict(self, with_hits: bool = False) -> dict:
        data = asdict(self)
        if not with_hits:
            del data["hits"], data["tier_hits"]
        data.update(
            device_hit_tokens=self.device_hit_tokens,
            hit_rate=self.hit_rate,
            share_of_oracle=self.share_of_oracle,
            share_of_bound=self.share_of_bound,
        )
        return data


@dataclass
class WhatIfReport:
    """`as_ran` replays the engine's own settings; `agreement` counts the requests whose
    replayed hit equals the hit the engine recorded."""

    num_requests: int
    num_prompt_tokens: int
    recorded_tokens: int  # the hit tokens the engine reported
    agreement: int
    as_ran: SettingResult
    results: list[SettingResult]
    peer: str | None = None  # a bridged peer's kind: `as_ran` is its recorded hits, unreplayed

    @property
    def exact(self) -> bool:
        return self.peer is None and self.agreement == self.num_requests

    def gain(self, result: SettingResult) -> int:
        """Hit tokens `result` saves beyond what ran (negative: it loses them)."""
        return result.hit_tokens - self.as_ran.hit_tokens

    def ranked(self) -> list[SettingResult]:
        """The settings tried, most tokens saved first."""
        return sorted(self.results, key=self.gain, reverse=True)

    def as_dict(self, with_hits: bool = False) -> dict:
        return {
            "num_requests": self.num_requests,
            "num_prompt_tokens": self.num_prompt_tokens,
            "recorded_tokens": self.recorded_tokens,
            "agreement": self.agreement,
            "exact": self.exact,
            "peer": self.peer,
            "as_ran": self.as_ran.as_dict(with_hits),
            "results": [
                {**r.as_dict(with_hits), "gain_tokens": self.gain(r)} for r in self.ranked()
            ],
        }


def report_from_dict(data: dict) -> WhatIfReport:
    """`WhatIfReport.as_dict`'s JSON back (the control plane's stored report); a result that
    left its hits out has none."""

    def result(item: dict) -> SettingResult:
        fields = {name: item[name] for name in SettingResult.__dataclass_fields__ if name in item}
        fields.setdefault("hits", [])
        fields.setdefault("tier_hits", [])
        return SettingResult(**fields)

    return WhatIfReport(
        num_requests=data["num_requests"],
        num_prompt_tokens=data["num_prompt_tokens"],
        recorded_tokens=data["recorded_tokens"],
        agreement=data["agreement"],
        as_ran=result(data["as_ran"]),
        results=[result(item) for item in data["results"]],
        peer=data.get("peer"),
    )
