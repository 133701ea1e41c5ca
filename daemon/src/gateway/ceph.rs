//! The gateway group's RADOS objects through librados ([`Store`] for the daemon).
//!
//! In the group's pool and namespace:
//! * `<name>.members`: shared lock `member` (tag = the group name), one holder per gateway
//!   instance, cookie = gateway id; its lease is the group's lease, so a member that stops
//!   renewing disappears from `rados lock list` by itself.
//! * `<name>.ana.<group>`: exclusive lock `owner`, cookie = gateway id, description = the
//!   holder's gateway id and client address (for operators: `rados lock info`); the object's
//!   content is the owner record (`owner <gateway> <client> <addr>` or `released`), which
//!   outlives an expired lock so that the next owner knows whom to fence.

use std::sync::Arc;
use std::time::Duration;

use rados::{Cluster, IoCtx, LockMode};

use super::lease::{Fault, Instance, Record, Survey};
use super::round::Store;

const MEMBER_LOCK: &str = "member";
const OWNER_LOCK: &str = "owner";
/// An owner record is one short line.
const RECORD_MAX: usize = 512;

/// One gateway instance's handle on the group's objects.
pub struct CephStore {
    cluster: Arc<Cluster>,
    io: IoCtx,
    name: String,
    me: Instance,
    lease: Duration,
}

fn fault(e: &rados::Error) -> Fault {
    match e.errno() {
        Some(libc::ESHUTDOWN) => Fault::Blocklisted,
        Some(libc::EBUSY) | Some(libc::EEXIST) => Fault::Busy,
        Some(e) => Fault::Other(e),
        None => Fault::Other(libc::EINVAL),
    }
}

impl CephStore {
    pub fn new(
        cluster: Arc<Cluster>,
        pool: &str,
        namespace: Option<&str>,
        name: &str,
        gateway: &str,
        lease: Duration,
    ) -> Result<CephStore, rados::Error> {
        let io = cluster.ioctx(pool, namespace)?;
        let me = Instance {
            gateway: gateway.to_owned(),
            client: format!("client.{}", cluster.instance_id()),
            addr: cluster.addrs()?,
        };
        Ok(CephStore {
            cluster,
            io,
            name: name.to_owned(),
            me,
            lease,
        })
    }

    pub fn me(&self) -> &Instance {
        &self.me
    }

    fn members_oid(&self) -> String {
        format!("{}.members", self.name)
    }

    fn group_oid(&self, group: u32) -> String {
        format!("{}.ana.{group}", self.name)
    }

    /// Takes or renews this gateway's lock on a group's owner object; the lock's description
    /// records the client address that a taker must blocklist.
    fn lock_owner(&self, group: u32, mode: LockMode) -> rados::Result<()> {
        let desc = format!(
            "gateway {} client {} at {}",
            self.me.gateway, self.me.client, self.me.addr
        );
        self.io.lock_exclusive(
            &self.group_oid(group),
            OWNER_LOCK,
            &self.me.gateway,
            &desc,
            self.lease,
            mode,
        )
    }

    fn holder(&self, group: u32) -> Result<Option<Instance>, Fault> {
        let lockers = self
            .io
            .list_lockers(&self.group_oid(group), OWNER_LOCK)
            .map_err(|e| fault(&e))?;
        Ok(lockers.lockers.into_iter().next().map(|l| Instance {
            gateway: l.cookie,
            client: l.client,
            addr: l.addr,
        }))
    }

    fn record(&self, group: u32) -> Result<Record, Fault> {
        match self.io.read(&self.group_oid(group), RECORD_MAX) {
            Ok(bytes) => Ok(parse_record(&bytes)),
            Err(e) if e.errno() == Some(libc::ENOENT) => Ok(Record::None),
            Err(e) => Err(fault(&e)),
        }
    }
}

/// The owner record's text; anything unreadable counts as no record (nobody to fence is
/// known: the lock's expiry still keeps a live owner's group).
fn parse_record(bytes: &[u8]) -> Record {
    let text = String::from_utf8_lossy(bytes);
    let words: Vec<&str> = text.split_whitespace().collect();
    match words[..] {
        ["released"] => Record::Released,
        ["owner", gateway, client, addr] => Record::Owner(Instance {
            gateway: gateway.to_owned(),
            client: client.to_owned(),
            addr: addr.to_owned(),
        }),
        _ => Record::None,
    }
}

fn format_record(record: &Record) -> String {
    match record {
        Record::None => String::new(),
        Record::Released => "released\n".to_owned(),
        Record::Owner(i) => format!("owner {} {} {}\n", i.gateway, i.client, i.addr),
    }
}

impl Store for CephStore {
    fn renew_member(&self) -> Result<(), Fault> {
        self.io
            .lock_shared(
                &self.members_oid(),
                MEMBER_LOCK,
                &self.me.gateway,
                &self.name,
                self.lease,
                LockMode::AcquireOrRenew,
            )
            .map_err(|e| fault(&e))
    }

    fn survey(&self, groups: &[u32]) -> Result<Survey, Fault> {
        let members = self
            .io
            .list_lockers(&self.members_oid(), MEMBER_LOCK)
            .map_err(|e| fault(&e))?
            .lockers
            .into_iter()
            .map(|l| Instance {
                gateway: l.cookie,
                client: l.client,
                addr: l.addr,
            })
            .collect();
        let mut survey = Survey {
            members,
            groups: Default::default(),
        };
        for &g in groups {
            let holder = self.holder(g)?;
            let record = self.record(g)?;
            survey.groups.insert(g, (holder, record));
        }
        Ok(survey)
    }

    fn renew(&self, group: u32) -> Result<(), Fault> {
        self.lock_owner(group, LockMode::Renew)
            .map_err(|e| match e.errno() {
                // MUST_RENEW: not ours any more.
                Some(libc::ENOENT) | Some(libc::EBUSY) => Fault::Lost,
                _ => fault(&e),
            })
    }

    fn blocklist(&self, addr: &str) -> Result<(), Fault> {
        // Zero: the cluster's default expiry (mon_osd_blocklist_default_expire, 1 h); the
        // fenced instance never comes back (a restart is a new instance with a new nonce).
        self.cluster
            .blocklist_add(addr, Duration::ZERO)
            .map_err(|e| fault(&e))
    }

    fn break_lock(&self, group: u32, holder: &Instance) -> Result<(), Fault> {
        match self.io.break_lock(
            &self.group_oid(group),
            OWNER_LOCK,
            &holder.client,
            &holder.gateway,
        ) {
            Ok(()) => Ok(()),
            Err(e) if e.errno() == Some(libc::ENOENT) => Ok(()),
            Err(e) => Err(fault(&e)),
        }
    }

    fn lock(&self, group: u32) -> Result<(), Fault> {
        self.lock_owner(group, LockMode::AcquireOrRenew)
            .map_err(|e| fault(&e))
    }

    fn write_record(&self, group: u32, record: &Record) -> Result<(), Fault> {
        self.io
            .write_full(&self.group_oid(group), format_record(record).as_bytes())
            .map_err(|e| fault(&e))
    }

    fn unlock(&self, group: u32) -> Result<(), Fault> {
        self.io
            .unlock(&self.group_oid(group), OWNER_LOCK, &self.me.gateway)
            .map_err(|e| match e.errno() {
                Some(libc::ENOENT) => Fault::Lost,
                _ => fault(&e),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_records_round_trip_and_garbage_is_no_record() {
        let i = Instance {
            gateway: "gw-a".into(),
            client: "client.4113".into(),
            addr: "v1:127.0.0.1:0/989363394".into(),
        };
        for r in [Record::Released, Record::Owner(i)] {
            assert_eq!(parse_record(format_record(&r).as_bytes()), r);
        }
        assert_eq!(parse_record(b""), Record::None);
        assert_eq!(parse_record(b"owner a b"), Record::None);
        assert_eq!(parse_record(&[0xff, 0xfe]), Record::None);
    }
}
