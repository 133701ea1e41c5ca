//! Identify data structures (NVMe Base 2.0 §5.17.2): Identify Controller (CNS 01h, Figure 275),
//! Identify Namespace for the NVM command set (CNS 00h, NVM Command Set 1.0 Figure 97), the
//! active namespace ID list (CNS 02h) and the namespace identification descriptor list
//! (CNS 03h, Figure 274). Only fields nvmfd sets or a host reads are named; everything else
//! encodes as zero.

use super::fabrics::encode_nqn;
use codec::{
    exact, put_u16_at, put_u32_at, put_u64_at, u16_at, u32_at, u64_at, DecodeError, Reader,
};

/// Every Identify data structure is one 4 KiB page.
pub const IDENTIFY_DATA_SIZE: usize = 4096;

/// Controller type (Identify Controller byte 111).
pub mod cntrltype {
    pub const IO: u8 = 1;
    pub const DISCOVERY: u8 = 2;
}

/// Identify Controller (Figure 275).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentifyController {
    pub vid: u16,
    pub ssvid: u16,
    /// Serial number, space-padded ASCII.
    pub sn: [u8; 20],
    /// Model number, space-padded ASCII.
    pub mn: [u8; 40],
    /// Firmware revision, space-padded ASCII.
    pub fr: [u8; 8],
    pub rab: u8,
    pub ieee: [u8; 3],
    pub cmic: u8,
    pub mdts: u8,
    pub cntlid: u16,
    pub ver: u32,
    pub oaes: u32,
    pub ctratt: u32,
    pub cntrltype: u8,
    pub oacs: u16,
    pub acl: u8,
    pub aerl: u8,
    pub frmw: u8,
    pub lpa: u8,
    pub elpe: u8,
    pub npss: u8,
    pub wctemp: u16,
    pub cctemp: u16,
    /// Keep alive granularity in 100 ms units.
    pub kas: u16,
    /// ANA transition time in seconds (how long a group may stay in the change state).
    pub anatt: u8,
    /// ANA capabilities (states reported, ANAGRPID behaviour), `ctrl_bits::ANACAP_*`.
    pub anacap: u8,
    /// Largest ANA group ID, and the number of ANA group IDs supported.
    pub anagrpmax: u32,
    pub nanagrpid: u32,
    pub sqes: u8,
    pub cqes: u8,
    pub maxcmd: u16,
    pub nn: u32,
    pub oncs: u16,
    pub fuses: u16,
    /// Optional Copy Formats Supported (bit 0: Source Range Entries format 0).
    pub ocfs: u16,
    pub fna: u8,
    pub vwc: u8,
    pub awun: u16,
    pub awupf: u16,
    pub sgls: u32,
    pub mnan: u32,
    /// NVM subsystem NQN, NUL-terminated (not space-padded).
    pub subnqn: String,
    pub ioccsz: u32,
    pub iorcsz: u32,
    pub icdoff: u16,
    pub fcatt: u8,
    pub msdbd: u8,
    /// Power state 0 descriptor: maximum power (centiwatts), entry/exit latency (µs).
    pub psd0_max_power: u16,
    pub psd0_entry_lat: u32,
    pub psd0_exit_lat: u32,
}

/// Offsets of the named fields (Figure 275), one place for encode and decode.
mod ctrl_off {
    pub const SN: usize = 4;
    pub const MN: usize = 24;
    pub const FR: usize = 64;
    pub const RAB: usize = 72;
    pub const IEEE: usize = 73;
    pub const CMIC: usize = 76;
    pub const MDTS: usize = 77;
    pub const CNTLID: usize = 78;
    pub const VER: usize = 80;
    pub const OAES: usize = 92;
    pub const CTRATT: usize = 96;
    pub const CNTRLTYPE: usize = 111;
    pub const OACS: usize = 256;
    pub const ACL: usize = 258;
    pub const AERL: usize = 259;
    pub const FRMW: usize = 260;
    pub const LPA: usize = 261;
    pub const ELPE: usize = 262;
    pub const NPSS: usize = 263;
    pub const WCTEMP: usize = 266;
    pub const CCTEMP: usize = 268;
    pub const KAS: usize = 320;
    pub const ANATT: usize = 342;
    pub const ANACAP: usize = 343;
    pub const ANAGRPMAX: usize = 344;
    pub const NANAGRPID: usize = 348;
    pub const SQES: usize = 512;
    pub const CQES: usize = 513;
    pub const MAXCMD: usize = 514;
    pub const NN: usize = 516;
    pub const ONCS: usize = 520;
    pub const FUSES: usize = 522;
    pub const FNA: usize = 524;
    pub const VWC: usize = 525;
    pub const AWUN: usize = 526;
    pub const AWUPF: usize = 528;
    pub const OCFS: usize = 534;
    pub const SGLS: usize = 536;
    pub const MNAN: usize = 540;
    pub const SUBNQN: usize = 768;
    pub const SUBNQN_LEN: usize = 256;
    pub const IOCCSZ: usize = 1792;
    pub const IORCSZ: usize = 1796;
    pub const ICDOFF: usize = 1800;
    pub const FCATT: usize = 1802;
    pub const MSDBD: usize = 1803;
    pub const PSD0: usize = 2048;
}

const _: () = assert!(ctrl_off::SUBNQN + ctrl_off::SUBNQN_LEN == 1024);
const _: () = assert!(ctrl_off::PSD0 + 32 * 32 == 3072);

/// Bit definitions used in Identify Controller.
pub mod ctrl_bits {
    /// CMIC bit 0: more than one port; bit 1: more than one controller (NVMe Base 2.0 Fig. 275).
    pub const CMIC_MULTI_PORT: u8 = 1 << 0;
    pub const CMIC_MULTI_CTRL: u8 = 1 << 1;
    /// CMIC bit 3: Asymmetric Namespace Access reporting (the Linux host then reads log 0Ch).
    pub const CMIC_ANA: u8 = 1 << 3;
    /// OAES bit 8: Namespace Attribute Notices.
    pub const OAES_NS_ATTR: u32 = 1 << 8;
    /// OAES bit 11: Asymmetric Namespace Access Change Notices.
    pub const OAES_ANA_CHANGE: u32 = 1 << 11;
    /// OAES bit 31: Discovery Log Page Change Notification.
    pub const OAES_DISC_LOG_CHANGE: u32 = 1 << 31;
    /// CTRATT bit 0: 128-bit host identifier; bit 6: traffic based keep alive.
    pub const CTRATT_HOST_ID_128: u32 = 1 << 0;
    pub const CTRATT_TBKAS: u32 = 1 << 6;
    /// LPA: bit 0 SMART per namespace, bit 1 commands supported and effects, bit 2 extended
    /// data for Get Log Page (NUMDU/LPOU).
    pub const LPA_SMART_PER_NS: u8 = 1 << 0;
    pub const LPA_CMD_EFFECTS: u8 = 1 << 1;
    pub const LPA_EXTENDED_DATA: u8 = 1 << 2;
    /// ONCS bit 0 Compare, 2 Dataset Management, 3 Write Zeroes, 6 Timestamp.
    pub const ONCS_COMPARE: u16 = 1 << 0;
    pub const ONCS_DSM: u16 = 1 << 2;
    pub const ONCS_WRITE_ZEROES: u16 = 1 << 3;
    pub const ONCS_TIMESTAMP: u16 = 1 << 6;
    /// ONCS bit 7 Verify, bit 8 Copy (NVMe Base 2.0 Figure 275).
    pub const ONCS_VERIFY: u16 = 1 << 7;
    pub const ONCS_COPY: u16 = 1 << 8;
    /// OCFS bit 0: Copy descriptor format 0h.
    pub const OCFS_FORMAT_0: u16 = 1 << 0;
    /// FUSES bit 0: fused Compare and Write supported.
    pub const FUSES_COMPARE_AND_WRITE: u16 = 1 << 0;
    /// VWC bit 0: a volatile write cache is present.
    pub const VWC_PRESENT: u8 = 1 << 0;
    /// SGLS bit 0 (bits 1:0 = 01b): SGLs supported, no alignment requirement; bit 2 keyed
    /// SGL data block; bit 20 offset (in-capsule) addressing supported.
    pub const SGLS_SUPPORTED: u32 = 1 << 0;
    pub const SGLS_KEYED: u32 = 1 << 2;
    pub const SGLS_OFFSET: u32 = 1 << 20;
    /// ANACAP bits 0–4: the optimized, non-optimized, inaccessible, persistent loss and change
    /// states are reported; bit 6 (ANAGRPID never changes while attached) stays clear because
    /// a reload may move a namespace to another group.
    pub const ANACAP_OPTIMIZED: u8 = 1 << 0;
    pub const ANACAP_NON_OPTIMIZED: u8 = 1 << 1;
    pub const ANACAP_INACCESSIBLE: u8 = 1 << 2;
    pub const ANACAP_PERSISTENT_LOSS: u8 = 1 << 3;
    pub const ANACAP_CHANGE: u8 = 1 << 4;
}

fn array<const N: usize>(b: &[u8], off: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[off..off + N]);
    a
}

/// Space-pads ASCII into a fixed field (NVMe Base 2.0 §1.5: ASCII strings are left justified
/// and padded with spaces). Non-printable characters become '?' so hosts can print it.
pub fn space_padded<const N: usize>(s: &str) -> [u8; N] {
    let mut out = [b' '; N];
    for (dst, src) in out.iter_mut().zip(s.bytes()) {
        *dst = if (0x20..0x7f).contains(&src) {
            src
        } else {
            b'?'
        };
    }
    out
}

/// The full-page input every Identify decoder expects.
fn page(bytes: &[u8]) -> Result<&[u8; IDENTIFY_DATA_SIZE], DecodeError> {
    exact(bytes)
}

impl IdentifyController {
    pub fn encode(&self) -> Box<[u8; IDENTIFY_DATA_SIZE]> {
        use ctrl_off::*;
        let mut b = Box::new([0u8; IDENTIFY_DATA_SIZE]);
        put_u16_at(&mut b, 0, self.vid);
        put_u16_at(&mut b, 2, self.ssvid);
        b[SN..SN + 20].copy_from_slice(&self.sn);
        b[MN..MN + 40].copy_from_slice(&self.mn);
        b[FR..FR + 8].copy_from_slice(&self.fr);
        b[RAB] = self.rab;
        b[IEEE..IEEE + 3].copy_from_slice(&self.ieee);
        b[CMIC] = self.cmic;
        b[MDTS] = self.mdts;
        put_u16_at(&mut b, CNTLID, self.cntlid);
        put_u32_at(&mut b, VER, self.ver);
        put_u32_at(&mut b, OAES, self.oaes);
        put_u32_at(&mut b, CTRATT, self.ctratt);
        b[CNTRLTYPE] = self.cntrltype;
        put_u16_at(&mut b, OACS, self.oacs);
        b[ACL] = self.acl;
        b[AERL] = self.aerl;
        b[FRMW] = self.frmw;
        b[LPA] = self.lpa;
        b[ELPE] = self.elpe;
        b[NPSS] = self.npss;
        put_u16_at(&mut b, WCTEMP, self.wctemp);
        put_u16_at(&mut b, CCTEMP, self.cctemp);
        put_u16_at(&mut b, KAS, self.kas);
        b[ANATT] = self.anatt;
        b[ANACAP] = self.anacap;
        put_u32_at(&mut b, ANAGRPMAX, self.anagrpmax);
        put_u32_at(&mut b, NANAGRPID, self.nanagrpid);
        b[SQES] = self.sqes;
        b[CQES] = self.cqes;
        put_u16_at(&mut b, MAXCMD, self.maxcmd);
        put_u32_at(&mut b, NN, self.nn);
        put_u16_at(&mut b, ONCS, self.oncs);
        put_u16_at(&mut b, FUSES, self.fuses);
        b[FNA] = self.fna;
        b[VWC] = self.vwc;
        put_u16_at(&mut b, AWUN, self.awun);
        put_u16_at(&mut b, AWUPF, self.awupf);
        put_u16_at(&mut b, OCFS, self.ocfs);
        put_u32_at(&mut b, SGLS, self.sgls);
        put_u32_at(&mut b, MNAN, self.mnan);
        encode_nqn(&mut b[SUBNQN..SUBNQN + SUBNQN_LEN], &self.subnqn);
        put_u32_at(&mut b, IOCCSZ, self.ioccsz);
        put_u32_at(&mut b, IORCSZ, self.iorcsz);
        put_u16_at(&mut b, ICDOFF, self.icdoff);
        b[FCATT] = self.fcatt;
        b[MSDBD] = self.msdbd;
        // Power state descriptor (Figure 276): MP bytes 1:0, ENLAT 7:4, EXLAT 11:8.
        put_u16_at(&mut b, PSD0, self.psd0_max_power);
        put_u32_at(&mut b, PSD0 + 4, self.psd0_entry_lat);
        put_u32_at(&mut b, PSD0 + 8, self.psd0_exit_lat);
        b
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        use ctrl_off::*;
        let b = page(bytes)?;
        let nqn_field = &b[SUBNQN..SUBNQN + SUBNQN_LEN];
        let nqn_end = nqn_field.iter().position(|&c| c == 0).unwrap_or(SUBNQN_LEN);
        Ok(Self {
            vid: u16_at(b, 0),
            ssvid: u16_at(b, 2),
            sn: array(b, SN),
            mn: array(b, MN),
            fr: array(b, FR),
            rab: b[RAB],
            ieee: array(b, IEEE),
            cmic: b[CMIC],
            mdts: b[MDTS],
            cntlid: u16_at(b, CNTLID),
            ver: u32_at(b, VER),
            oaes: u32_at(b, OAES),
            ctratt: u32_at(b, CTRATT),
            cntrltype: b[CNTRLTYPE],
            oacs: u16_at(b, OACS),
            acl: b[ACL],
            aerl: b[AERL],
            frmw: b[FRMW],
            lpa: b[LPA],
            elpe: b[ELPE],
            npss: b[NPSS],
            wctemp: u16_at(b, WCTEMP),
            cctemp: u16_at(b, CCTEMP),
            kas: u16_at(b, KAS),
            anatt: b[ANATT],
            anacap: b[ANACAP],
            anagrpmax: u32_at(b, ANAGRPMAX),
            nanagrpid: u32_at(b, NANAGRPID),
            sqes: b[SQES],
            cqes: b[CQES],
            maxcmd: u16_at(b, MAXCMD),
            nn: u32_at(b, NN),
            oncs: u16_at(b, ONCS),
            fuses: u16_at(b, FUSES),
            fna: b[FNA],
            vwc: b[VWC],
            awun: u16_at(b, AWUN),
            awupf: u16_at(b, AWUPF),
            ocfs: u16_at(b, OCFS),
            sgls: u32_at(b, SGLS),
            mnan: u32_at(b, MNAN),
            subnqn: String::from_utf8_lossy(&nqn_field[..nqn_end]).into_owned(),
            ioccsz: u32_at(b, IOCCSZ),
            iorcsz: u32_at(b, IORCSZ),
            icdoff: u16_at(b, ICDOFF),
            fcatt: b[FCATT],
            msdbd: b[MSDBD],
            psd0_max_power: u16_at(b, PSD0),
            psd0_entry_lat: u32_at(b, PSD0 + 4),
            psd0_exit_lat: u32_at(b, PSD0 + 8),
        })
    }
}

/// Identify Namespace, NVM command set (NVM Command Set 1.0 Figure 97), with one LBA format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IdentifyNamespace {
    pub nsze: u64,
    pub ncap: u64,
    pub nuse: u64,
    pub nsfeat: u8,
    /// Number of LBA formats, 0's based.
    pub nlbaf: u8,
    pub flbas: u8,
    pub nmic: u8,
    /// Reservation capabilities (byte 31).
    pub rescap: u8,
    pub dlfeat: u8,
    /// Namespace preferred write granularity / alignment / deallocate granularity /
    /// alignment / optimal write size, 0's based in logical blocks (valid if NSFEAT bit 4).
    pub npwg: u16,
    pub npwa: u16,
    pub npdg: u16,
    pub npda: u16,
    pub nows: u16,
    /// Copy limits (NVM Command Set 1.0 Figure 97): Maximum Single Source Range Length and
    /// Maximum Copy Length in logical blocks, Maximum Source Range Count (0's based).
    pub mssrl: u16,
    pub mcl: u32,
    pub msrc: u8,
    /// ANA group of this namespace (0 = not reported).
    pub anagrpid: u32,
    /// Namespace attributes: bit 0 write protected.
    pub nsattr: u8,
    pub nguid: [u8; 16],
    pub eui64: [u8; 8],
    /// LBA format 0: LBA data size as a power of two.
    pub lbaf0_lbads: u8,
}

mod ns_off {
    pub const NSZE: usize = 0;
    pub const NCAP: usize = 8;
    pub const NUSE: usize = 16;
    pub const NSFEAT: usize = 24;
    pub const NLBAF: usize = 25;
    pub const FLBAS: usize = 26;
    pub const NMIC: usize = 30;
    pub const RESCAP: usize = 31;
    pub const DLFEAT: usize = 33;
    pub const NPWG: usize = 64;
    pub const NPWA: usize = 66;
    pub const NPDG: usize = 68;
    pub const NPDA: usize = 70;
    pub const NOWS: usize = 72;
    pub const MSSRL: usize = 74;
    pub const MCL: usize = 76;
    pub const MSRC: usize = 80;
    pub const ANAGRPID: usize = 92;
    pub const NSATTR: usize = 99;
    pub const NGUID: usize = 104;
    pub const EUI64: usize = 120;
    pub const LBAF0: usize = 128;
}

const _: () = assert!(ns_off::NGUID + 16 == ns_off::EUI64 && ns_off::EUI64 + 8 == ns_off::LBAF0);

/// Bit definitions used in Identify Namespace.
pub mod ns_bits {
    /// NSFEAT bit 2: deallocated blocks read as zero per DLFEAT; bit 4: NPWG..NOWS valid.
    pub const NSFEAT_DEALLOC_ERROR: u8 = 1 << 2;
    pub const NSFEAT_OPTPERF: u8 = 1 << 4;
    /// NMIC bit 0: may be attached to two or more controllers (shared).
    pub const NMIC_SHARED: u8 = 1 << 0;
    /// DLFEAT bits 2:0 = 001b (deallocated blocks read as zero); bit 3: Write Zeroes may
    /// deallocate.
    pub const DLFEAT_READ_ZEROES: u8 = 0b001;
    pub const DLFEAT_WRITE_ZEROES_DEALLOCATES: u8 = 1 << 3;
    /// NSATTR bit 0: the namespace is write protected.
    pub const NSATTR_WRITE_PROTECTED: u8 = 1 << 0;
}

impl IdentifyNamespace {
    pub fn encode(&self) -> Box<[u8; IDENTIFY_DATA_SIZE]> {
        use ns_off::*;
        let mut b = Box::new([0u8; IDENTIFY_DATA_SIZE]);
        put_u64_at(&mut b, NSZE, self.nsze);
        put_u64_at(&mut b, NCAP, self.ncap);
        put_u64_at(&mut b, NUSE, self.nuse);
        b[NSFEAT] = self.nsfeat;
        b[NLBAF] = self.nlbaf;
        b[FLBAS] = self.flbas;
        b[NMIC] = self.nmic;
        b[RESCAP] = self.rescap;
        b[DLFEAT] = self.dlfeat;
        put_u16_at(&mut b, NPWG, self.npwg);
        put_u16_at(&mut b, NPWA, self.npwa);
        put_u16_at(&mut b, NPDG, self.npdg);
        put_u16_at(&mut b, NPDA, self.npda);
        put_u16_at(&mut b, NOWS, self.nows);
        put_u16_at(&mut b, MSSRL, self.mssrl);
        put_u32_at(&mut b, MCL, self.mcl);
        b[MSRC] = self.msrc;
        put_u32_at(&mut b, ANAGRPID, self.anagrpid);
        b[NSATTR] = self.nsattr;
        b[NGUID..NGUID + 16].copy_from_slice(&self.nguid);
        b[EUI64..EUI64 + 8].copy_from_slice(&self.eui64);
        // LBA format (Figure 98): MS bits 15:0 = 0, LBADS bits 23:16, RP bits 25:24 = 0 (best).
        b[LBAF0 + 2] = self.lbaf0_lbads;
        b
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        use ns_off::*;
        let b = page(bytes)?;
        Ok(Self {
            nsze: u64_at(b, NSZE),
            ncap: u64_at(b, NCAP),
            nuse: u64_at(b, NUSE),
            nsfeat: b[NSFEAT],
            nlbaf: b[NLBAF],
            flbas: b[FLBAS],
            nmic: b[NMIC],
            rescap: b[RESCAP],
            dlfeat: b[DLFEAT],
            npwg: u16_at(b, NPWG),
            npwa: u16_at(b, NPWA),
            npdg: u16_at(b, NPDG),
            npda: u16_at(b, NPDA),
            nows: u16_at(b, NOWS),
            mssrl: u16_at(b, MSSRL),
            mcl: u32_at(b, MCL),
            msrc: b[MSRC],
            anagrpid: u32_at(b, ANAGRPID),
            nsattr: b[NSATTR],
            nguid: array(b, NGUID),
            eui64: array(b, EUI64),
            lbaf0_lbads: b[LBAF0 + 2],
        })
    }
}

/// I/O Command Set specific Identify Controller for the NVM command set (CNS 06h, CSI 00h;
/// NVM Command Set 1.0 Figure 100): the limits a host splits Write Zeroes and Dataset
/// Management by. Every field 0 means "no limit reported".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IdentifyControllerNvm {
    /// Write Zeroes Size Limit: 2^n units of CAP.MPSMIN (4 KiB).
    pub wzsl: u8,
    /// Dataset Management Ranges Limit: ranges per command.
    pub dmrl: u8,
    /// Dataset Management Range Size Limit: logical blocks per range.
    pub dmrsl: u32,
    /// Dataset Management Size Limit: logical blocks per command, all ranges together.
    pub dmsl: u64,
}

mod nvm_ctrl_off {
    pub const WZSL: usize = 1;
    pub const DMRL: usize = 3;
    pub const DMRSL: usize = 4;
    pub const DMSL: usize = 8;
}

impl IdentifyControllerNvm {
    pub fn encode(&self) -> Box<[u8; IDENTIFY_DATA_SIZE]> {
        use nvm_ctrl_off::*;
        let mut b = Box::new([0u8; IDENTIFY_DATA_SIZE]);
        b[WZSL] = self.wzsl;
        b[DMRL] = self.dmrl;
        put_u32_at(&mut b, DMRSL, self.dmrsl);
        put_u64_at(&mut b, DMSL, self.dmsl);
        b
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        use nvm_ctrl_off::*;
        let b = page(bytes)?;
        Ok(Self {
            wzsl: b[WZSL],
            dmrl: b[DMRL],
            dmrsl: u32_at(b, DMRSL),
            dmsl: u64_at(b, DMSL),
        })
    }
}

/// Active Namespace ID list (CNS 02h): up to 1024 NSIDs greater than the command's NSID, in
/// increasing order, zero-terminated.
pub fn encode_active_ns_list(nsids_ascending: impl Iterator<Item = u32>, out: &mut [u8]) {
    const MAX: usize = IDENTIFY_DATA_SIZE / 4;
    let n = IDENTIFY_DATA_SIZE.min(out.len());
    let out = &mut out[..n];
    out.fill(0);
    for (slot, nsid) in out.chunks_exact_mut(4).zip(nsids_ascending.take(MAX)) {
        slot.copy_from_slice(&nsid.to_le_bytes());
    }
}

pub fn decode_active_ns_list(bytes: &[u8]) -> Result<Vec<u32>, DecodeError> {
    let b = page(bytes)?;
    Ok(b.chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .take_while(|&n| n != 0)
        .collect())
}

/// One Namespace Identification Descriptor (Figure 274/275: NIDT, NIDL, 2 reserved, NID).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NsDescriptor {
    Eui64([u8; 8]),
    Nguid([u8; 16]),
    Uuid([u8; 16]),
    /// Command Set Identifier (0 = NVM).
    Csi(u8),
}

impl NsDescriptor {
    pub const HEADER: usize = 4;

    fn nidt(&self) -> u8 {
        match self {
            Self::Eui64(_) => 1,
            Self::Nguid(_) => 2,
            Self::Uuid(_) => 3,
            Self::Csi(_) => 4,
        }
    }

    fn nid(&self) -> &[u8] {
        match self {
            Self::Eui64(v) => v,
            Self::Nguid(v) | Self::Uuid(v) => v,
            Self::Csi(v) => std::slice::from_ref(v),
        }
    }

    /// Encodes a descriptor list into a zeroed 4 KiB page (a zero NIDT terminates the list).
    pub fn encode_list(list: &[NsDescriptor]) -> Box<[u8; IDENTIFY_DATA_SIZE]> {
        let mut b = Box::new([0u8; IDENTIFY_DATA_SIZE]);
        let mut pos = 0;
        for d in list {
            let nid = d.nid();
            b[pos] = d.nidt();
            b[pos + 1] = nid.len() as u8;
            b[pos + Self::HEADER..pos + Self::HEADER + nid.len()].copy_from_slice(nid);
            pos += Self::HEADER + nid.len();
        }
        b
    }

    pub fn decode_list(bytes: &[u8]) -> Result<Vec<NsDescriptor>, DecodeError> {
        let mut r = Reader::new(page(bytes)?);
        let mut out = Vec::new();
        while r.remaining() >= Self::HEADER {
            let nidt = r.u8()?;
            let nidl = r.u8()?;
            r.take(2)?;
            if nidt == 0 {
                break;
            }
            let nid = r.take(nidl as usize)?;
            let bad = DecodeError::InvalidValue {
                field: "nidl",
                value: nidl as u64,
            };
            out.push(match (nidt, nidl) {
                (1, 8) => Self::Eui64(array(nid, 0)),
                (2, 16) => Self::Nguid(array(nid, 0)),
                (3, 16) => Self::Uuid(array(nid, 0)),
                (4, 1) => Self::Csi(nid[0]),
                (1..=4, _) => return Err(bad),
                (other, _) => {
                    return Err(DecodeError::InvalidValue {
                        field: "nidt",
                        value: other as u64,
                    })
                }
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests;
