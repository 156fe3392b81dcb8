//! Reclaim planner (issue 39, elastic memory): which containers the agent asks, through their limits file's
//! `evict_mask`, to move their memory above their request to host memory, so that a container waiting for
//! memory within its limit gets it (a restore of its own evicted memory, or growth). Pure logic: the agent
//! feeds it each pass's figures and writes the bits.
//!
//! Trust: resident bytes (NVML), requests and limits (the agent's own limits files) and NVML activity are the
//! agent's; a container's `waiting` and `last_use_ns` words are its own and may be forged, so:
//! - a wait is served only for bytes within the waiter's limit (NVML resident + waiting <= limit), waits
//!   within the request first (on a GPU with one, waits above a request wait for the next pass), and only
//!   when the device has no room for it: a forged wait can make the agent evict at most what the waiter could
//!   have allocated anyway, never while the device has room, and only others' memory above their request
//!   (a guaranteed tenant, request = limit, is never asked);
//! - only memory above a victim's request is asked for, least recently used first, never a container NVML saw
//!   busy within the idle threshold; a container's own claim of recent use (`last_use_ns`) protects it only
//!   while idle others suffice (a claim in the future counts as now), so claiming activity for ever cannot hold
//!   anyone else below its request;
//! - an eviction is done when NVML shows the victim at or below its request and none of the waiters it was asked
//!   for still waits (else the victim's next launch would restore its memory before the waiter's retry took
//!   it), or at the timeout (then the bit is cleared too: what did not move is unmovable, or the tenant ignored
//!   the ask, which is reported).

use std::collections::BTreeMap;

/// A container on a GPU: (container name, GPU UUID).
pub type Key = (String, String);

/// The planner's settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// A container NVML saw busy, or that says it used the device, within this long is active.
    pub idle_ns: u64,
    /// Node budget of pinned host memory for evicted bytes; 0 = reclaim off.
    pub pinned_budget: u64,
    /// An eviction not done by then is ended (its bit cleared) and reported.
    pub timeout_ns: u64,
}

/// Default idle threshold.
pub const DEFAULT_IDLE_NS: u64 = 2_000_000_000;
/// Default eviction timeout.
pub const DEFAULT_TIMEOUT_NS: u64 = 5_000_000_000;

impl Default for Settings {
    fn default() -> Self {
        Settings {
            idle_ns: DEFAULT_IDLE_NS,
            pinned_budget: 0,
            timeout_ns: DEFAULT_TIMEOUT_NS,
        }
    }
}

/// One container on one GPU this pass.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tenant {
    /// Its guaranteed bytes (`request_in_force`); `None` = promised nothing (uncapped).
    pub request: Option<u64>,
    /// Its cap; elastic when above the request.
    pub limit: Option<u64>,
    /// NVML: the sum of its members' used memory here (trusted).
    pub resident: u64,
    /// Its usage file's charge here (untrusted); evicted = charged - resident.
    pub charged: Option<u64>,
    /// Its `last_use_ns` word (untrusted), CLOCK_BOOTTIME ns; 0 = never.
    pub last_use_ns: u64,
    /// Bytes its `waiting` word asks for on this GPU (untrusted); 0 = none.
    pub waiting: u64,
    /// CLOCK_BOOTTIME ns when NVML last saw it run kernels here (trusted); `None` = never seen.
    pub busy_ns: Option<u64>,
}

impl Tenant {
    fn elastic(&self) -> bool {
        matches!((self.request, self.limit), (Some(r), Some(l)) if r < l)
    }

    /// What it may still have in host memory, as far as the budget is concerned: its own word bounded by what
    /// it could legitimately have moved (the part of its limit above its request).
    pub fn evicted(&self) -> u64 {
        match (self.request, self.limit, self.charged) {
            (Some(r), Some(l), Some(c)) if r < l => c.saturating_sub(self.resident).min(l - r),
            _ => 0,
        }
    }

    fn above_request(&self) -> u64 {
        self.request.map_or(0, |r| self.resident.saturating_sub(r))
    }
}

/// One GPU this pass.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Gpu {
    /// NVML free memory.
    pub free: u64,
}

/// What happened to an eviction this pass (for logs and reports).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// Asked to evict.
    Asked {
        /// Its resident bytes above its request.
        bytes: u64,
    },
    /// Done: resident at or below its request, or NVML saw it busy again.
    Done {
        /// Resident bytes gone since the ask.
        moved: u64,
    },
    /// Timed out (its bit cleared).
    TimedOut {
        /// Resident bytes gone since the ask; 0 = it ignored the ask.
        moved: u64,
    },
    /// A wait that was not served.
    Refused {
        /// What it waits for.
        bytes: u64,
        /// Why not.
        why: &'static str,
    },
    /// Its `last_use_ns` lies in the future (forged or a clock from elsewhere): counted as now.
    FutureLastUse,
}

#[derive(Clone, Debug)]
struct Eviction {
    since_ns: u64,
    resident_at_ask: u64,
    /// The waiters it was asked for: its bit stays while one of them still waits (bounded by the timeout).
    for_waiters: Vec<Key>,
}

/// The planner: evictions in progress between passes.
#[derive(Debug, Default)]
pub struct Planner {
    /// The settings.
    pub settings: Settings,
    evicting: BTreeMap<Key, Eviction>,
    /// Timed out: not asked again before this CLOCK_BOOTTIME ns (a tenant that ignores asks is not asked every
    /// pass, and others are asked meanwhile).
    resting: BTreeMap<Key, u64>,
}

/// A pass's plan.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// The (container, GPU) pairs whose evict bit is to be set; every other one is cleared.
    pub evict: Vec<Key>,
    /// What happened, per (container, GPU).
    pub events: Vec<(Key, Event)>,
}

impl Planner {
    /// A planner with `settings`.
    pub fn new(settings: Settings) -> Planner {
        Planner {
            settings,
            evicting: BTreeMap::new(),
            resting: BTreeMap::new(),
        }
    }

    /// Bytes the agent estimates in pinned host memory (what the last [`Planner::plan`] saw).
    pub fn pinned_estimate(tenants: &BTreeMap<Key, Tenant>) -> u64 {
        tenants.values().map(Tenant::evicted).fold(0, u64::saturating_add)
    }

    /// One pass: `gpus` by UUID, `tenants` by (container, GPU), `now_ns` CLOCK_BOOTTIME.
    pub fn plan(
        &mut self,
        gpus: &BTreeMap<String, Gpu>,
        tenants: &BTreeMap<Key, Tenant>,
        now_ns: u64,
    ) -> Plan {
        let s = self.settings;
        let mut events = Vec::new();
        let busy = |t: &Tenant| t.busy_ns.is_some_and(|b| now_ns.saturating_sub(b) < s.idle_ns);
        // Evictions in progress: done, woken, timed out or gone.
        let mut ended = Vec::new();
        for (k, e) in &self.evicting {
            let Some(t) = tenants.get(k) else {
                ended.push(k.clone());
                continue;
            };
            let moved = e.resident_at_ask.saturating_sub(t.resident);
            let timed_out = now_ns.saturating_sub(e.since_ns) >= s.timeout_ns;
            let waited_on = e
                .for_waiters
                .iter()
                .any(|w| tenants.get(w).is_some_and(|w| w.waiting != 0));
            let reached = t.resident <= t.request.unwrap_or(u64::MAX);
            if busy(t) || (reached && (!waited_on || timed_out)) {
                events.push((k.clone(), Event::Done { moved }));
            } else if timed_out {
                events.push((k.clone(), Event::TimedOut { moved }));
                self.resting
                    .insert(k.clone(), now_ns.saturating_add(s.timeout_ns));
            } else {
                continue;
            }
            ended.push(k.clone());
        }
        for k in ended {
            self.evicting.remove(&k);
        }
        self.resting
            .retain(|k, until| *until > now_ns && tenants.contains_key(k));
        // The claims of recent use, counted as now when in the future.
        let mut last_use: BTreeMap<&Key, u64> = BTreeMap::new();
        for (k, t) in tenants {
            if t.last_use_ns > now_ns {
                events.push((k.clone(), Event::FutureLastUse));
            }
            last_use.insert(k, t.last_use_ns.min(now_ns));
        }
        let mut pinned = Self::pinned_estimate(tenants);
        // Bytes still to come from evictions in progress, reserved against the budget and counted as reclaimed.
        for k in self.evicting.keys() {
            if let Some(t) = tenants.get(k) {
                pinned = pinned.saturating_add(t.above_request());
            }
        }
        for (uuid, gpu) in gpus {
            let here = |k: &Key| &k.1 == uuid;
            // Waits within the waiter's request, else (none on this GPU) waits above it within its limit.
            let (mut within, mut above) = ((0u64, Vec::new()), (0u64, Vec::new()));
            for (k, t) in tenants.iter().filter(|(k, _)| here(k)) {
                if t.waiting == 0 {
                    continue;
                }
                let upto = t.resident.saturating_add(t.waiting);
                let side = match (t.request, t.limit) {
                    (Some(r), _) if upto <= r => &mut within,
                    (Some(_), Some(l)) if upto <= l => &mut above,
                    _ => {
                        events.push((
                            k.clone(),
                            Event::Refused {
                                bytes: t.waiting,
                                why: "beyond its limit, or promised nothing",
                            },
                        ));
                        continue;
                    }
                };
                side.0 = side.0.saturating_add(t.waiting);
                side.1.push(k.clone());
            }
            let (need, waiters) = if within.1.is_empty() { above } else { within };
            let coming: u64 = self
                .evicting
                .keys()
                .filter(|k| here(k))
                .filter_map(|k| tenants.get(k))
                .map(Tenant::above_request)
                .fold(0, u64::saturating_add);
            let mut short = need.saturating_sub(gpu.free).saturating_sub(coming);
            if short == 0 {
                continue;
            }
            // Victims: elastic, above their request, not waiting, not busy by NVML, not already asked;
            // those that claim no recent use first, then the claimers; least recently used first in each.
            let mut victims: Vec<(bool, u64, &Key, &Tenant)> = tenants
                .iter()
                .filter(|(k, t)| {
                    here(k)
                        && t.elastic()
                        && t.waiting == 0
                        && t.above_request() > 0
                        && !busy(t)
                        && !self.evicting.contains_key(*k)
                        && !self.resting.contains_key(*k)
                })
                .map(|(k, t)| {
                    let lu = last_use[k];
                    (now_ns.saturating_sub(lu) < s.idle_ns, lu, k, t)
                })
                .collect();
            victims.sort_by(|a, b| (a.0, a.1, a.2).cmp(&(b.0, b.1, b.2)));
            for (_, _, k, t) in victims {
                if short == 0 {
                    break;
                }
                let bytes = t.above_request();
                if pinned.saturating_add(bytes) > s.pinned_budget {
                    continue;
                }
                pinned += bytes;
                short = short.saturating_sub(bytes);
                self.evicting.insert(
                    k.clone(),
                    Eviction {
                        since_ns: now_ns,
                        resident_at_ask: t.resident,
                        for_waiters: waiters.clone(),
                    },
                );
                events.push((k.clone(), Event::Asked { bytes }));
            }
        }
        Plan {
            evict: self.evicting.keys().cloned().collect(),
            events,
        }
    }
}

/// Decodes a `waiting` word: (usage device entry, bytes); `None` for 0 or an entry past `entries`.
pub fn decode_waiting(word: u64, entries: usize) -> Option<(usize, u64)> {
    let tag = (word >> 56) as usize;
    (tag != 0 && tag <= entries).then(|| (tag - 1, word & ((1 << 56) - 1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1 << 30;
    const S: u64 = 1_000_000_000;
    const NOW: u64 = 1_000 * S;

    fn k(c: &str) -> Key {
        (c.to_string(), "GPU-0".to_string())
    }

    /// An idle elastic tenant: request 2 GiB, limit 8 GiB, `resident` GiB resident and charged, last used
    /// `idle_s` seconds ago.
    fn idle(resident: u64, idle_s: u64) -> Tenant {
        Tenant {
            request: Some(2 * G),
            limit: Some(8 * G),
            resident: resident * G,
            charged: Some(resident * G),
            last_use_ns: NOW - idle_s * S,
            waiting: 0,
            busy_ns: Some(NOW - idle_s * S),
        }
    }

    /// A guaranteed tenant (request = limit 4 GiB) holding `resident` GiB and waiting for `waiting` GiB.
    fn waiter(resident: u64, waiting: u64) -> Tenant {
        Tenant {
            request: Some(4 * G),
            limit: Some(4 * G),
            resident: resident * G,
            charged: Some(resident * G),
            last_use_ns: NOW,
            waiting: waiting * G,
            busy_ns: Some(NOW),
        }
    }

    fn gpu(free: u64) -> BTreeMap<String, Gpu> {
        BTreeMap::from([("GPU-0".to_string(), Gpu { free })])
    }

    fn planner() -> Planner {
        Planner::new(Settings {
            pinned_budget: 64 * G,
            ..Default::default()
        })
    }

    fn asked(p: &Plan) -> Vec<&str> {
        p.evict.iter().map(|k| k.0.as_str()).collect()
    }

    /// The control: a waiter within its request on a full device gets the least recently used idle elastic
    /// tenant evicted, only as many as needed.
    fn control() -> BTreeMap<Key, Tenant> {
        BTreeMap::from([
            (k("a-old"), idle(5, 60)),
            (k("b-newer"), idle(5, 10)),
            (k("w"), waiter(1, 2)),
        ])
    }

    #[test]
    fn a_waiter_within_its_request_gets_the_least_recently_used_idle_tenant_evicted() {
        let mut p = planner();
        let plan = p.plan(&gpu(0), &control(), NOW);
        assert_eq!(asked(&plan), ["a-old"], "one eviction of 3 GiB covers 2 GiB");
        assert!(plan.events.contains(&(k("a-old"), Event::Asked { bytes: 3 * G })));
        // The next pass, still in progress: nothing more asked.
        let plan = p.plan(&gpu(0), &control(), NOW + S);
        assert_eq!(asked(&plan), ["a-old"]);
        // Two waiters' worth: both idle tenants.
        let mut t = control();
        t.get_mut(&k("w")).unwrap().waiting = 3 * G;
        t.insert(k("w2"), waiter(0, 2));
        assert_eq!(asked(&planner().plan(&gpu(0), &t, NOW)), ["a-old", "b-newer"]);
    }

    #[test]
    fn the_bit_clears_when_nvml_shows_it_done_or_at_the_timeout() {
        let mut p = planner();
        p.plan(&gpu(0), &control(), NOW);
        let mut t = control();
        t.get_mut(&k("a-old")).unwrap().resident = 2 * G; // moved down to its request
        t.get_mut(&k("w")).unwrap().waiting = 0;
        let plan = p.plan(&gpu(3 * G), &t, NOW + S);
        assert!(plan.evict.is_empty());
        assert!(plan.events.contains(&(k("a-old"), Event::Done { moved: 3 * G })));
        // A tenant that ignores the ask: ended at the timeout, reported as having moved nothing.
        let mut p = planner();
        p.plan(&gpu(0), &control(), NOW);
        let plan = p.plan(&gpu(0), &control(), NOW + DEFAULT_TIMEOUT_NS - 1);
        assert_eq!(asked(&plan), ["a-old"]);
        let plan = p.plan(&gpu(0), &control(), NOW + DEFAULT_TIMEOUT_NS);
        assert!(plan.events.contains(&(k("a-old"), Event::TimedOut { moved: 0 })));
        assert_eq!(
            asked(&plan),
            ["b-newer"],
            "its bit is cleared, the next one asked"
        );
    }

    /// The victim at its request while the waiter still waits (its retry has not taken the memory yet): the
    /// bit stays, so the victim's next launch does not restore first; cleared once the waiter stops waiting, or
    /// at the timeout however long it waits.
    #[test]
    fn the_bit_stays_while_the_waiter_it_serves_still_waits() {
        let mut p = planner();
        p.plan(&gpu(0), &control(), NOW);
        let mut t = control();
        t.get_mut(&k("a-old")).unwrap().resident = 2 * G;
        let plan = p.plan(&gpu(3 * G), &t, NOW + S);
        assert_eq!(asked(&plan), ["a-old"], "cleared while the waiter still waits");
        t.get_mut(&k("w")).unwrap().waiting = 0;
        let plan = p.plan(&gpu(G), &t, NOW + 2 * S);
        assert!(plan.evict.is_empty());
        assert!(plan.events.contains(&(k("a-old"), Event::Done { moved: 3 * G })));
        // A waiter that never stops waiting holds it only until the timeout.
        let mut p = planner();
        p.plan(&gpu(0), &control(), NOW);
        let mut t = control();
        t.get_mut(&k("a-old")).unwrap().resident = 2 * G;
        assert_eq!(
            asked(&p.plan(&gpu(3 * G), &t, NOW + DEFAULT_TIMEOUT_NS - 1)),
            ["a-old"]
        );
        let plan = p.plan(&gpu(3 * G), &t, NOW + DEFAULT_TIMEOUT_NS);
        assert!(plan.evict.is_empty(), "held past the timeout");
        assert!(plan.events.contains(&(k("a-old"), Event::Done { moved: 3 * G })));
    }

    #[test]
    fn never_a_tenant_nvml_saw_busy_nor_one_without_a_request_or_below_it() {
        let mut t = control();
        t.get_mut(&k("a-old")).unwrap().busy_ns = Some(NOW - S); // busy 1 s ago
        assert_eq!(asked(&planner().plan(&gpu(0), &t, NOW)), ["b-newer"]);
        t.get_mut(&k("b-newer")).unwrap().resident = 2 * G; // at its request
        assert!(planner().plan(&gpu(0), &t, NOW).evict.is_empty());
        let mut t = control();
        for c in ["a-old", "b-newer"] {
            let v = t.get_mut(&k(c)).unwrap();
            v.limit = v.request; // not elastic
        }
        assert!(planner().plan(&gpu(0), &t, NOW).evict.is_empty());
    }

    #[test]
    fn never_beyond_the_pinned_host_budget() {
        let mut p = Planner::new(Settings {
            pinned_budget: 4 * G,
            ..Default::default()
        });
        let mut t = control();
        let b = t.get_mut(&k("b-newer")).unwrap();
        (b.resident, b.charged) = (3 * G, Some(3 * G)); // 1 GiB above its request
        t.get_mut(&k("w")).unwrap().waiting = G;
        // a-old's 3 GiB fit the 4 GiB budget.
        assert_eq!(asked(&p.plan(&gpu(0), &t, NOW)), ["a-old"]);
        // Already 2 GiB in host memory elsewhere: a-old's 3 no longer fit, b-newer's 1 does.
        let mut t2 = t.clone();
        let mut far = idle(2, 100);
        far.charged = Some(4 * G);
        t2.insert(("far".to_string(), "GPU-1".to_string()), far);
        assert_eq!(asked(&planner_with(4 * G).plan(&gpu(0), &t2, NOW)), ["b-newer"]);
        // Budget 0 = reclaim off.
        assert!(planner_with(0).plan(&gpu(0), &t, NOW).evict.is_empty());
    }

    fn planner_with(budget: u64) -> Planner {
        Planner::new(Settings {
            pinned_budget: budget,
            ..Default::default()
        })
    }

    #[test]
    fn a_forged_wait_beyond_the_limit_or_on_a_device_with_room_evicts_nobody() {
        // Control: 2 GiB within the request on a full device evicts (above).
        let mut t = control();
        t.get_mut(&k("w")).unwrap().waiting = 4 * G; // 1 + 4 > 4
        let plan = planner().plan(&gpu(0), &t, NOW);
        assert!(plan.evict.is_empty(), "beyond its request: {plan:?}");
        assert!(matches!(plan.events[0].1, Event::Refused { .. }));
        // Within its request, but the device has room: nobody.
        assert!(planner().plan(&gpu(2 * G), &control(), NOW).evict.is_empty());
        // Partly room: only the shortfall (1 GiB): the newer tenant's 3 would do, but LRU picks the oldest.
        assert_eq!(asked(&planner().plan(&gpu(G), &control(), NOW)), ["a-old"]);
        // An elastic tenant waiting beyond its limit (2 + 7 > 8) evicts nobody.
        let mut t = control();
        t.insert(k("burst"), bursting(7));
        t.get_mut(&k("w")).unwrap().waiting = 0;
        assert!(planner().plan(&gpu(0), &t, NOW).evict.is_empty());
        // An uncapped tenant is promised nothing.
        let mut t = control();
        let w = t.get_mut(&k("w")).unwrap();
        (w.request, w.limit) = (None, None);
        assert!(planner().plan(&gpu(0), &t, NOW).evict.is_empty());
    }

    /// An active elastic tenant at its request (2 GiB) waiting for `waiting` GiB above it (a restore or growth).
    fn bursting(waiting: u64) -> Tenant {
        let mut b = idle(2, 0);
        b.waiting = waiting * G;
        b
    }

    #[test]
    fn a_wait_above_the_request_within_the_limit_gets_idle_tenants_evicted_least_recently_used_first() {
        let mut t = control();
        t.get_mut(&k("w")).unwrap().waiting = 0;
        t.insert(k("burst"), bursting(2));
        let plan = planner().plan(&gpu(0), &t, NOW);
        assert_eq!(asked(&plan), ["a-old"]);
        assert!(plan.events.contains(&(k("a-old"), Event::Asked { bytes: 3 * G })));
        // Control: the device has room for it: nobody.
        assert!(planner().plan(&gpu(2 * G), &t, NOW).evict.is_empty());
    }

    /// Only others' memory above their request is fair game for a waiter above its own: a guaranteed tenant
    /// (request = limit) and an elastic one at its request are never asked, however idle.
    #[test]
    fn a_wait_above_the_request_never_pushes_anyone_below_their_request() {
        let mut g = waiter(4, 0);
        (g.last_use_ns, g.busy_ns) = (0, Some(0));
        let t = BTreeMap::from([
            (k("guaranteed"), g),
            (k("at-request"), idle(2, 600)),
            (k("burst"), bursting(4)),
        ]);
        let plan = planner().plan(&gpu(0), &t, NOW);
        assert!(plan.evict.is_empty(), "{plan:?}");
        // Control: an idle tenant above its request beside them is asked, for its part above the request only.
        let mut t2 = t.clone();
        t2.insert(k("above"), idle(3, 5));
        let plan = planner().plan(&gpu(0), &t2, NOW);
        assert_eq!(asked(&plan), ["above"]);
        assert!(plan.events.contains(&(k("above"), Event::Asked { bytes: G })));
    }

    #[test]
    fn a_wait_within_a_request_goes_before_one_above() {
        // The waiter within its request needs 2 GiB, the burster 4: only the first is served (a-old's 3).
        let mut t = control();
        t.insert(k("burst"), bursting(4));
        assert_eq!(asked(&planner().plan(&gpu(0), &t, NOW)), ["a-old"]);
        // Control: the burster alone gets both idle tenants for its 4 GiB.
        t.get_mut(&k("w")).unwrap().waiting = 0;
        assert_eq!(asked(&planner().plan(&gpu(0), &t, NOW)), ["a-old", "b-newer"]);
    }

    #[test]
    fn a_forged_wait_takes_no_more_than_the_waiters_request_from_others() {
        // It waits for exactly what its request leaves (3 GiB): evictions cover those 3 GiB, no more.
        let mut t = control();
        t.get_mut(&k("w")).unwrap().waiting = 3 * G;
        t.insert(k("c-newest"), idle(5, 5));
        let plan = planner().plan(&gpu(0), &t, NOW);
        assert_eq!(asked(&plan), ["a-old"]);
    }

    #[test]
    fn a_forged_last_use_in_the_future_protects_only_while_idle_others_suffice() {
        // Control: a-old is the oldest and is asked.
        assert_eq!(asked(&planner().plan(&gpu(0), &control(), NOW)), ["a-old"]);
        // a-old claims a use far in the future: the idle b-newer is asked instead, and it is reported.
        let mut t = control();
        t.get_mut(&k("a-old")).unwrap().last_use_ns = u64::MAX;
        let plan = planner().plan(&gpu(0), &t, NOW);
        assert_eq!(asked(&plan), ["b-newer"]);
        assert!(plan.events.contains(&(k("a-old"), Event::FutureLastUse)));
        // Every idle tenant claims it: the claim no longer protects (NVML saw none busy), LRU by the claims
        // (clamped to now: both equal, name order).
        t.get_mut(&k("b-newer")).unwrap().last_use_ns = u64::MAX;
        t.get_mut(&k("w")).unwrap().waiting = 4 * G - G;
        let plan = planner().plan(&gpu(0), &t, NOW);
        assert_eq!(asked(&plan), ["a-old"], "the waiter still gets its request");
        // Claiming the present for ever does no better.
        let mut t = control();
        for c in ["a-old", "b-newer"] {
            t.get_mut(&k(c)).unwrap().last_use_ns = NOW;
        }
        assert_eq!(asked(&planner().plan(&gpu(0), &t, NOW)), ["a-old"]);
    }

    #[test]
    fn a_forged_last_use_in_the_past_costs_only_the_forger() {
        let mut t = control();
        t.get_mut(&k("b-newer")).unwrap().last_use_ns = 0;
        assert_eq!(asked(&planner().plan(&gpu(0), &t, NOW)), ["b-newer"]);
        // Without a waiter, a forged past evicts nobody.
        t.get_mut(&k("w")).unwrap().waiting = 0;
        assert!(planner().plan(&gpu(0), &t, NOW).evict.is_empty());
    }

    #[test]
    fn a_forged_charge_spends_the_budget_only_up_to_its_own_elastic_part() {
        let mut t = control();
        t.insert(("liar".to_string(), "GPU-1".to_string()), {
            let mut l = idle(2, 0);
            l.charged = Some(u64::MAX);
            l
        });
        // The liar counts 6 GiB (its limit less its request) of the 9 GiB budget: a-old's 3 still fit.
        assert_eq!(asked(&planner_with(9 * G).plan(&gpu(0), &t, NOW)), ["a-old"]);
    }

    #[test]
    fn waiting_words_decode_only_to_known_entries() {
        assert_eq!(decode_waiting(0, 4), None);
        assert_eq!(decode_waiting((1 << 56) | 5, 4), Some((0, 5)));
        assert_eq!(decode_waiting((4 << 56) | 5, 4), Some((3, 5)));
        assert_eq!(decode_waiting((5 << 56) | 5, 4), None, "past the entries");
        assert_eq!(decode_waiting(u64::MAX, 4), None);
    }
}
