//! File-system operations on the locked metadata state: namespace changes (create, link,
//! unlink, rename...), file contents (read mapping, write, truncate, fallocate) and extended
//! attributes. Each public operation runs inside one critical section, so it lands whole in
//! one transaction; each checks what can fail before it changes anything.

use std::sync::Arc;

use crate::format::ext4::dirent::{self, ft};
use crate::format::ext4::extent::node_capacity;
use crate::format::ext4::inode::{self, flags, mode, Inode, InodeTime};
use crate::format::ext4::xattr::{self, Xattr};
use crate::{FsError, Result};

use super::api::{Attr, Creds, FileKind, RenameFlags, SetAttr, SetTime, Timestamp, XattrSetMode};
use super::cached_writes::{from_ts, later, to_ts, SPARE_BLOCKS};
use super::datacache::{zero_page, DataCache, WholePages};
use super::extents::{inode_goal, ExtentMap};
use super::log_credits::{free_credits, runs_credits, Reserve, TREE_CREDITS};
use super::meta::{Io, Meta};
use super::mode_record;
use super::read_plan::{self, ReadSegment};

/// Most hard links an inode may have (and subdirectories before `dir_nlink` takes over).
pub(crate) const LINK_MAX: u16 = 65000;

/// The name, in the `security.` namespace, of a file's capabilities.
const CAPABILITY_NAME: &[u8] = b"capability";

/// The coarse clock (`CLOCK_REALTIME_COARSE`: the time of the last tick), as the kernel's
/// multigrain timestamps use it.
fn coarse_now() -> InodeTime {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::RealtimeCoarse);
    InodeTime {
        sec: t.tv_sec,
        nsec: u32::try_from(t.tv_nsec).unwrap_or(0),
    }
}

/// The time a change gives an inode whose ctime is `ctime` (multigrain timestamps, see
/// `Meta::change_time`): the coarse clock (or `ctime` when the coarse clock is not after it)
/// when nobody was shown its times since they last changed (`unseen`), else the fine clock.
pub(crate) fn change_time_after(unseen: bool, ctime: InodeTime) -> InodeTime {
    if !unseen {
        return now();
    }
    later(ctime, coarse_now())
}

pub(crate) fn now() -> InodeTime {
    from_ts(Timestamp::now())
}

pub(crate) fn kind_of(m: u16) -> FileKind {
    match m & mode::S_IFMT {
        mode::S_IFDIR => FileKind::Dir,
        mode::S_IFLNK => FileKind::Symlink,
        mode::S_IFCHR => FileKind::CharDev,
        mode::S_IFBLK => FileKind::BlockDev,
        mode::S_IFIFO => FileKind::Fifo,
        mode::S_IFSOCK => FileKind::Socket,
        _ => FileKind::File,
    }
}

/// Mode `m` without the set-ID bits a write, truncate or change of owner by a caller without
/// `CAP_FSETID` clears, as the kernel does: set-user-ID always, set-group-ID when the group
/// may execute the file (without that, the bit means mandatory locking and stays).
pub(crate) fn without_set_id(m: u16) -> u16 {
    let mut kept = m & !mode::S_ISUID;
    if m & mode::S_IXGRP != 0 {
        kept &= !mode::S_ISGID;
    }
    kept
}

pub(crate) fn ft_of(m: u16) -> u8 {
    match m & mode::S_IFMT {
        mode::S_IFDIR => ft::DIR,
        mode::S_IFLNK => ft::SYMLINK,
        mode::S_IFCHR => ft::CHR,
        mode::S_IFBLK => ft::BLK,
        mode::S_IFIFO => ft::FIFO,
        mode::S_IFSOCK => ft::SOCK,
        _ => ft::REG,
    }
}

pub(crate) fn kind_of_ft(t: u8) -> Option<FileKind> {
    Some(match t {
        ft::REG => FileKind::File,
        ft::DIR => FileKind::Dir,
        ft::CHR => FileKind::CharDev,
        ft::BLK => FileKind::BlockDev,
        ft::FIFO => FileKind::Fifo,
        ft::SOCK => FileKind::Socket,
        ft::SYMLINK => FileKind::Symlink,
        _ => return None,
    })
}

/// A directory's link count after gaining a subdirectory. With `dir_nlink`, as in ext4's
/// `ext4_inc_count`, a count that would reach [`LINK_MAX`] becomes 1 ("too many to count"),
/// and 1 stays 1. Never overflows, whatever count is on disk.
fn dir_nlink_inc(links: u16) -> u16 {
    if links == 1 || links >= LINK_MAX - 1 {
        1
    } else {
        links + 1
    }
}

fn check_name(name: &[u8]) -> Result<()> {
    if name.is_empty() || name.contains(&b'/') || name.contains(&0) {
        return Err(FsError::Invalid("bad file name"));
    }
    if name.len() > dirent::NAME_MAX {
        return Err(FsError::NameTooLong);
    }
    Ok(())
}

/// A change to one file block through the page cache ([`Meta::put_data`]).
struct Piece<'a> {
    lblk: u32,
    /// The block's mapping: `(physical block, unwritten)`, or `None` for a hole.
    home: Option<(u64, bool)>,
    /// Byte offset inside the block.
    offset: usize,
    bytes: &'a [u8],
    /// Length of the whole request this piece belongs to (see `Page::first_write`).
    request_len: usize,
    /// The block's old bytes, read before the operation filled any page
    /// ([`Meta::write`]), for a piece that covers part of a block written on disk.
    old: Option<Arc<[u8]>>,
    /// The block's whole new content, made before the metadata lock was taken, for a piece
    /// that covers all of it (`WholePages`): it becomes the page, not copied under the lock.
    whole: Option<&'a Arc<[u8]>>,
}

impl<'a> Piece<'a> {
    /// Zeros put by truncate, punch or zero range: one request per piece.
    fn zeros(lblk: u32, home: Option<(u64, bool)>, offset: usize, zeros: &'a [u8]) -> Self {
        Piece {
            lblk,
            home,
            offset,
            bytes: zeros,
            request_len: zeros.len(),
            old: None,
            whole: None,
        }
    }
}

impl Meta {
    pub(crate) fn ino32(&self, ino: u64) -> Result<u32> {
        self.geo.ino32(ino)
    }

    /// Reads an inode that must be in use.
    pub(crate) fn live_inode(&mut self, io: &Io, ino: u32) -> Result<Inode> {
        let inode = self.read_inode(io, ino)?;
        if !self.in_use(ino, &inode) {
            return Err(FsError::NotFound);
        }
        Ok(inode)
    }

    /// Whether inode `ino`, whose bytes are `inode`, is in use: linked, or open, or the root.
    pub(super) fn in_use(&self, ino: u32, inode: &Inode) -> bool {
        let held = inode.links_count() > 0
            || self.open.contains(ino)
            || ino == super::api::ROOT_INO as u32;
        held && inode.mode() != 0
    }

    /// The attributes of `ino` for a caller that hands them out: its times count as seen
    /// (multigrain timestamps, `Meta::change_time`).
    pub(crate) fn attr(&self, ino: u32, i: &Inode) -> Attr {
        // Built and marked seen in one hold of the page cache's mutex, which a write without
        // the lock holds while it changes the times (`Inner::write_cached`): that write comes
        // before (its size and times are shown here) or after (it sees this look).
        let pages = self.data.lock();
        let attr = self.attr_with(ino, i, &pages);
        self.names.shown(ino);
        attr
    }

    /// The attributes of `ino` from inode `i`, the blocks reserved for its cached pages and
    /// the size and times writes without the lock left (`pages` is the locked page cache).
    pub(super) fn attr_with(&self, ino: u32, i: &Inode, pages: &DataCache) -> Attr {
        let kind = kind_of(i.mode());
        let rdev = if matches!(kind, FileKind::CharDev | FileKind::BlockDev) {
            inode::decode_rdev(i.i_block())
        } else {
            0
        };
        let mut attr = Attr {
            ino: u64::from(ino),
            size: i.size(),
            // Blocks reserved for cached data count already, as with ext4's delayed allocation.
            blocks: i.blocks_512(self.geo.block_size)
                + pages.reserved_of(ino) * u64::from(self.geo.block_size / 512),
            atime: to_ts(i.atime()),
            mtime: to_ts(i.mtime()),
            ctime: to_ts(i.ctime()),
            crtime: to_ts(i.crtime()),
            kind,
            perm: i.mode() & 0o7777,
            nlink: u32::from(i.links_count()),
            uid: i.uid(),
            gid: i.gid(),
            rdev,
            blksize: self.geo.block_size,
            generation: i.generation(),
        };
        if let Some(p) = pages.writes().pending(ino) {
            p.apply_to_attr(&mut attr);
        }
        attr
    }

    fn dir_inode(&mut self, io: &Io, ino: u32) -> Result<Inode> {
        let i = self.live_inode(io, ino)?;
        if !i.is_dir() {
            return Err(FsError::NotDir);
        }
        Ok(i)
    }

    /// Allocates and initialises a new inode in the running transaction; `takes_block` says
    /// the operation allocates a block for it next (a directory, a slow symbolic link).
    fn new_inode(
        &mut self,
        io: &Io,
        (parent, parent_inode): (u32, &Inode),
        m: u16,
        creds: Creds,
        takes_block: bool,
    ) -> Result<(u32, Inode)> {
        let is_dir = m & mode::S_IFMT == mode::S_IFDIR;
        let near = (parent - 1) / self.geo.inodes_per_group;
        let ino = self.alloc_inode(io, near, (is_dir, takes_block))?;
        let mut i = Inode::new_zeroed(self.geo.inode_size as usize, self.geo.extra_isize);
        let mut m = m;
        let mut gid = creds.gid;
        if parent_inode.mode() & mode::S_ISGID != 0 {
            gid = parent_inode.gid();
            if is_dir {
                m |= mode::S_ISGID;
            }
        }
        i.set_mode(m);
        i.set_uid(creds.uid);
        i.set_gid(gid);
        let t = now();
        i.set_atime(t);
        i.set_mtime(t);
        i.set_ctime(t);
        i.set_crtime(t);
        self.next_generation = self.next_generation.wrapping_add(0x9E37_79B9);
        i.set_generation(self.next_generation);
        i.set_links_count(1);
        self.inherit_mode(io, parent, ino, &mut i)?;
        if matches!(m & mode::S_IFMT, mode::S_IFREG | mode::S_IFDIR) {
            let map = ExtentMap::default();
            let mut tmp = map.clone();
            tmp.store(self, io, ino, &mut i)?;
            self.put_extent_map(ino, map);
        }
        self.forget_inode_entirely(ino);
        Ok((ino, i))
    }

    /// Blocks an operation may need beyond data: inode-table and bitmap blocks are already
    /// allocated, so this covers a new directory block plus extent-tree growth.
    pub(super) fn ensure_space(&self, blocks: u64) -> Result<()> {
        if self.allocatable_blocks_for(blocks + 8) < blocks + 8 {
            return Err(FsError::NoSpace);
        }
        Ok(())
    }

    fn touch_dir(&mut self, io: &Io, dir: u32) -> Result<()> {
        let mut d = self.read_inode(io, dir)?;
        let t = now();
        d.set_mtime(t);
        d.set_ctime(t);
        self.write_inode(io, dir, &mut d)
    }

    /// Checks that `name` is free in `parent`, and that `parent` can take it, for an
    /// operation that will add it.
    fn check_absent(&mut self, io: &Io, parent: u32, name: &[u8]) -> Result<()> {
        check_name(name)?;
        if self.dir_lookup_to_change(io, parent, name)?.is_some() {
            return Err(FsError::Exists);
        }
        self.check_dir_tail(io, parent)
    }

    /// Creates a non-directory inode (file, device, fifo, socket).
    pub(crate) fn create(
        &mut self,
        io: &Io,
        parent: u32,
        name: &[u8],
        m: u32,
        rdev: u32,
        creds: Creds,
    ) -> Result<Attr> {
        let pi = self.dir_inode(io, parent)?;
        self.acts_for(io, parent)?;
        self.changes_names();
        self.check_absent(io, parent, name)?;
        self.ensure_space(2)?;
        let m = u16::try_from(m & 0o177777).map_err(|_| FsError::Invalid("mode"))?;
        let m = if m & mode::S_IFMT == 0 {
            m | mode::S_IFREG
        } else {
            m
        };
        if m & mode::S_IFMT == mode::S_IFDIR || m & mode::S_IFMT == mode::S_IFLNK {
            return Err(FsError::Invalid(
                "create cannot make directories or symlinks",
            ));
        }
        let (ino, mut i) = self.new_inode(io, (parent, &pi), m, creds, false)?;
        if matches!(m & mode::S_IFMT, mode::S_IFCHR | mode::S_IFBLK) {
            inode::encode_rdev(i.i_block_mut(), rdev);
        }
        self.write_inode(io, ino, &mut i)?;
        self.dir_add(io, parent, name, ino, ft_of(m))?;
        self.touch_dir(io, parent)?;
        // A new file has no capabilities: its first writes need not take the lock.
        self.allow_cached_writes(io, ino, &i)?;
        Ok(self.attr(ino, &i))
    }

    /// Creates an unnamed regular file in directory `parent` (O_TMPFILE): no links, on the
    /// orphan list, held by one open handle. Its last release frees it, and so does orphan
    /// processing at the next mount after a crash, unless [`Meta::link`] names it first.
    pub(crate) fn tmpfile(&mut self, io: &Io, parent: u32, m: u32, creds: Creds) -> Result<Attr> {
        let pi = self.dir_inode(io, parent)?;
        self.acts_for(io, parent)?;
        self.changes_names();
        let m = u16::try_from(m & 0o177777).map_err(|_| FsError::Invalid("mode"))?;
        let m = match m & mode::S_IFMT {
            0 | mode::S_IFREG => mode::S_IFREG | (m & 0o7777),
            _ => return Err(FsError::Invalid("O_TMPFILE makes regular files only")),
        };
        self.ensure_space(1)?;
        let (ino, mut i) = self.new_inode(io, (parent, &pi), m, creds, false)?;
        i.set_links_count(0);
        i.set_dtime(self.sb.last_orphan());
        self.sb.set_last_orphan(ino);
        self.sb_dirty = true;
        self.write_inode(io, ino, &mut i)?;
        self.open.add(ino);
        if let Some(u) = &mut self.op.undo {
            u.opened.push(ino);
        }
        Ok(self.attr(ino, &i))
    }

    /// Creates a directory.
    pub(crate) fn mkdir(
        &mut self,
        io: &Io,
        parent: u32,
        name: &[u8],
        perm: u16,
        creds: Creds,
    ) -> Result<Attr> {
        let mut pi = self.dir_inode(io, parent)?;
        self.acts_for(io, parent)?;
        self.changes_names();
        self.check_absent(io, parent, name)?;
        self.ensure_space(3)?;
        let (ino, mut i) = self.new_inode(
            io,
            (parent, &pi),
            mode::S_IFDIR | (perm & 0o7777),
            creds,
            true,
        )?;
        // First block with "." and "..".
        let csum = self.geo.csum_seed.is_some();
        let bs = self.geo.bs();
        let mut map = ExtentMap::default();
        let goal = inode_goal(&map, self, ino);
        let pblk = self.alloc_block(io, goal)?;
        let seed = self
            .geo
            .csum_seed
            .map(|s| crate::format::ext4::inode_csum_seed(s, ino, i.generation()));
        let b = self.new_block_mut(pblk);
        dirent::htree_root_to_linear(b, ino, parent, csum);
        if let Some(s) = seed {
            dirent::set_tail_checksum(b, s);
        }
        map.insert(0, pblk, false);
        map.store(self, io, ino, &mut i)?;
        self.put_extent_map(ino, map);
        i.set_size(bs as u64);
        i.set_blocks_512(i.blocks_512(self.geo.block_size) + u64::from(self.geo.block_size / 512));
        i.set_links_count(2);
        self.write_inode(io, ino, &mut i)?;
        self.dir_add(io, parent, name, ino, ft::DIR)?;
        // Re-read: dir_add may have grown the parent.
        pi = self.read_inode(io, parent)?;
        pi.set_links_count(dir_nlink_inc(pi.links_count()));
        let t = now();
        pi.set_mtime(t);
        pi.set_ctime(t);
        self.write_inode(io, parent, &mut pi)?;
        Ok(self.attr(ino, &i))
    }

    /// Creates a symbolic link.
    pub(crate) fn symlink(
        &mut self,
        io: &Io,
        parent: u32,
        name: &[u8],
        target: &[u8],
        creds: Creds,
    ) -> Result<Attr> {
        let pi = self.dir_inode(io, parent)?;
        self.acts_for(io, parent)?;
        self.changes_names();
        self.check_absent(io, parent, name)?;
        let bs = self.geo.bs();
        if target.is_empty() {
            return Err(FsError::NotFound);
        }
        if target.len() >= bs {
            return Err(FsError::NameTooLong);
        }
        self.ensure_space(3)?;
        let slow = target.len() >= inode::I_BLOCK_LEN;
        let (ino, mut i) = self.new_inode(io, (parent, &pi), mode::S_IFLNK | 0o777, creds, slow)?;
        if target.len() < inode::I_BLOCK_LEN {
            i.i_block_mut()[..target.len()].copy_from_slice(target);
        } else {
            let mut map = ExtentMap::default();
            let goal = inode_goal(&map, self, ino);
            let pblk = self.alloc_block(io, goal)?;
            // A slow symlink's block is logged like metadata, in every mode.
            self.new_block_mut(pblk)[..target.len()].copy_from_slice(target);
            map.insert(0, pblk, false);
            map.store(self, io, ino, &mut i)?;
            self.put_extent_map(ino, map);
            i.set_blocks_512(u64::from(self.geo.block_size / 512));
        }
        i.set_size(target.len() as u64);
        self.write_inode(io, ino, &mut i)?;
        self.dir_add(io, parent, name, ino, ft::SYMLINK)?;
        self.touch_dir(io, parent)?;
        Ok(self.attr(ino, &i))
    }

    /// Target of a symbolic link.
    pub(crate) fn readlink(&mut self, io: &Io, ino: u32) -> Result<Vec<u8>> {
        let i = self.live_inode(io, ino)?;
        if !i.is_symlink() {
            return Err(FsError::Invalid("not a symbolic link"));
        }
        let size = usize::try_from(i.size()).map_err(|_| FsError::corrupt("symlink size"))?;
        let target = if i.flags() & flags::EXTENTS == 0 {
            if size >= inode::I_BLOCK_LEN {
                return Err(FsError::corrupt_inode(ino, "inline symlink too long"));
            }
            i.i_block()[..size].to_vec()
        } else {
            let bs = self.geo.bs();
            if size > bs {
                return Err(FsError::corrupt_inode(ino, "symlink longer than a block"));
            }
            let map = self.extent_map(io, ino, &i)?;
            let Some((pblk, _)) = map.map(0) else {
                return Err(FsError::corrupt_inode(ino, "symlink without a block"));
            };
            self.block(io, pblk)?[..size].to_vec()
        };
        // Later reads of it need not take the lock (`Fs::readlink`).
        self.names.publish_target(ino, &target);
        Ok(target)
    }

    /// Adds a hard link.
    pub(crate) fn link(
        &mut self,
        io: &Io,
        ino: u32,
        new_parent: u32,
        new_name: &[u8],
    ) -> Result<Attr> {
        let mut i = self.live_inode(io, ino)?;
        if i.is_dir() {
            return Err(FsError::NotPermitted);
        }
        self.dir_inode(io, new_parent)?;
        self.acts_for(io, ino)?;
        self.acts_for(io, new_parent)?;
        self.changes_names();
        self.check_absent(io, new_parent, new_name)?;
        if i.links_count() >= LINK_MAX {
            return Err(FsError::TooManyLinks);
        }
        // A new directory block and its tree block, and the file's mode record.
        let record = self.relink_blocks(io, &[(ino, new_parent)])?;
        self.ensure_space(2 + record)?;
        if i.links_count() == 0 {
            self.orphan_link(io, ino)?;
        }
        self.dir_add(io, new_parent, new_name, ino, ft_of(i.mode()))?;
        if i.links_count() == 0 {
            // An O_TMPFILE inode (or an unlinked one still open) gets a name: it leaves the
            // orphan list, so neither its last release nor orphan processing frees it.
            self.remove_orphan(io, ino)?;
            i.set_dtime(0);
        }
        i.set_links_count(i.links_count() + 1);
        i.set_ctime(now());
        self.relink_mode(io, ino, &mut i, new_parent)?;
        self.write_inode(io, ino, &mut i)?;
        self.touch_dir(io, new_parent)?;
        Ok(self.attr(ino, &i))
    }

    /// Drops one link of a non-directory inode; frees it when unused.
    fn drop_link(&mut self, io: &Io, ino: u32) -> Result<()> {
        let mut i = self.read_inode(io, ino)?;
        let links = i.links_count().saturating_sub(1);
        i.set_links_count(links);
        i.set_ctime(now());
        if links == 0 {
            if self.open.last_link_dropped(ino, &self.names) {
                // Keep it until the last release; the orphan list frees it after a crash.
                i.set_dtime(self.sb.last_orphan());
                self.sb.set_last_orphan(ino);
                self.sb_dirty = true;
                self.write_inode(io, ino, &mut i)?;
            } else if self.too_big_to_free_at_once(io, ino, &i)? {
                // An orphan, freed in steps once this operation is done (`Meta::free_step`);
                // after a crash the orphan list finishes it. Its cached data never reaches
                // the device.
                self.data.lock().drop_file(ino);
                i.set_dtime(self.sb.last_orphan());
                self.sb.set_last_orphan(ino);
                self.sb_dirty = true;
                self.write_inode(io, ino, &mut i)?;
                self.op.free_in_steps.push(ino);
            } else {
                self.write_inode(io, ino, &mut i)?;
                self.free_inode_fully(io, ino)?;
            }
        } else {
            self.write_inode(io, ino, &mut i)?;
        }
        Ok(())
    }

    /// Loads the blocks that freeing inode `ino` (now `i`) will change besides its own
    /// inode-table block: the inode bitmap of its group, the block bitmaps of the groups its
    /// data and extent-tree blocks are in, those groups' descriptors, and its attribute
    /// block. Called before an operation's first change, so that one that must read them
    /// from the device stops for them with nothing to take back (docs/DESIGN.md §4.1). A
    /// block loaded and not used costs memory only; one missed costs a rollback only.
    fn fetch_for_free(&mut self, io: &Io, ino: u32, i: &Inode) -> Result<()> {
        let mut runs = self.runs_from(io, ino, i, 0, u64::MAX)?;
        if let Some(acl) = self.xattr_block(ino, i)? {
            self.load(io, acl)?;
            runs.push((acl, 1));
        }
        let own = (ino - 1) / self.geo.inodes_per_group;
        self.fetch_bitmaps(io, ino, &runs, Some(own))?;
        self.orphan_link(io, ino)?;
        Ok(())
    }

    /// The runs of blocks (first block, count) that freeing logical blocks `[from, to)` of
    /// `ino` (now `i`) releases, and its extent-tree blocks (which a shrinking tree may free).
    fn runs_from(
        &mut self,
        io: &Io,
        ino: u32,
        i: &Inode,
        from: u64,
        to: u64,
    ) -> Result<Vec<(u64, u64)>> {
        if i.flags() & flags::EXTENTS == 0 {
            return Ok(Vec::new());
        }
        let map = self.extent_map(io, ino, i)?;
        let mut runs: Vec<(u64, u64)> = map
            .extents()
            .iter()
            .filter_map(|e| {
                let (start, end) = (
                    u64::from(e.logical),
                    u64::from(e.logical) + u64::from(e.len),
                );
                let (lo, hi) = (start.max(from), end.min(to));
                (lo < hi).then(|| (e.physical + (lo - start), hi - lo))
            })
            .collect();
        runs.extend(map.tree_blocks().map(|b| (b, 1)));
        Ok(runs)
    }

    /// Loads the block bitmaps and group descriptors of the groups `runs` lie in, and the
    /// inode bitmap and descriptor of group `inode_group`: what freeing them (blocks of
    /// `ino`) changes (see [`Meta::fetch_for_free`]), and reserves the journal blocks for it.
    pub(super) fn fetch_bitmaps(
        &mut self,
        io: &Io,
        ino: u32,
        runs: &[(u64, u64)],
        inode_group: Option<u32>,
    ) -> Result<()> {
        let (first_block, last_group) =
            (self.geo.first_data_block, self.geo.groups.saturating_sub(1));
        let group = |b: u64| self.geo.group_of_block(b.max(first_block)).min(last_group);
        let mut groups = std::collections::BTreeSet::new();
        for &(start, len) in runs {
            let end = start.saturating_add(len.max(1) - 1);
            groups.extend(group(start)..=group(end));
        }
        // What the free changes, reserved before its first change: a bitmap and a descriptor
        // block per group, as many groups as one transaction frees in (more go in steps),
        // and the revoke records of the freed blocks that need one.
        let groups_freed = groups.len().min(Self::free_budget_groups(io));
        let revokes = self.revokes_for_free(io, ino, runs)?;
        let credits = free_credits(groups_freed) + revokes.div_ceil(io.journal.revokes_per_block());
        self.reserve_log_for(Reserve::Free(ino), credits)?;
        if let Some(g) = inode_group {
            if let Some(info) = self.alloc.groups.get(g as usize).copied() {
                self.load(io, info.inode_bitmap)?;
            }
            self.load(io, self.geo.desc_location(g).0)?;
        }
        for g in groups {
            self.load_block_group(io, g)?;
        }
        Ok(())
    }

    /// How many revoke records freeing `runs` of `ino` may add, at most: every block of a
    /// directory or a slow symbolic link (logged like metadata), every block the log still
    /// holds of another file, and the file's extent-tree blocks (`Meta::free_run_now`).
    fn revokes_for_free(&mut self, io: &Io, ino: u32, runs: &[(u64, u64)]) -> Result<usize> {
        let i = self.stored_inode(io, ino)?;
        let data: u64 = if i.is_dir() || i.is_symlink() {
            runs.iter().map(|&(_, len)| len).sum()
        } else {
            // A transaction closed and not yet durable is not in `held_in` yet.
            runs.iter()
                .map(|&(start, len)| {
                    let mut all = io.journal.held_in(start, len);
                    all.extend(self.committing_in(start, len));
                    all.sort_unstable();
                    all.dedup();
                    all.len() as u64
                })
                .sum()
        };
        let tree = if i.flags() & flags::EXTENTS != 0 {
            self.shared_extent_map(io, ino, &i)?.tree_blocks().count()
        } else {
            0
        };
        Ok(usize::try_from(data)
            .unwrap_or(usize::MAX)
            .saturating_add(tree))
    }

    /// Loads, before an operation's first change, what it will read to change bytes
    /// `[offset, end)` of `ino` (now `i`): with `edges`, the partial blocks at the edges that
    /// are written on disk and not in the page cache (zeroing part of one keeps its other
    /// bytes), and with `allocate`, the bitmaps and descriptors of the groups the range's
    /// holes will likely be allocated from (docs/DESIGN.md §4.1).
    fn fetch_for_range(
        &mut self,
        io: &Io,
        ino: u32,
        i: &Inode,
        (offset, end): (u64, u64),
        (edges, allocate): (bool, bool),
    ) -> Result<()> {
        if i.flags() & flags::EXTENTS == 0 {
            return Ok(());
        }
        let map = self.shared_extent_map(io, ino, i)?;
        let bs = u64::from(self.geo.block_size);
        let mut partial: Vec<u64> = [offset, end]
            .into_iter()
            .filter(|at| edges && at % bs != 0)
            .map(|at| at / bs)
            .collect();
        partial.dedup();
        // Both edges in one stop when both are cold.
        let cold: Vec<u64> = {
            let pages = self.data.lock();
            partial
                .into_iter()
                .filter_map(|lblk| u32::try_from(lblk).ok())
                .filter_map(|lblk| match map.map(lblk) {
                    Some((home, false)) if pages.get(ino, lblk).is_none() => Some(home),
                    _ => None,
                })
                .collect()
        };
        self.read_data_blocks(io, &cold)?;
        if allocate {
            let block = |at: u64| u32::try_from(at).unwrap_or(u32::MAX);
            let holes: u64 = map
                .holes(block(offset / bs), block(end.div_ceil(bs)))
                .iter()
                .map(|(a, b)| u64::from(b - a))
                .sum();
            if holes > 0 {
                let goal = inode_goal(&map, self, ino);
                self.fetch_for_allocation(io, goal, holes)?;
            }
        }
        Ok(())
    }

    /// Builds the index of directory `dir` when `moved` (to another parent: its `..` entry
    /// changes after the rename's first change), so that reading its blocks stops the
    /// rename before that change (docs/DESIGN.md §4.1).
    fn fetch_moved_dir(&mut self, io: &Io, dir: u32, moved: bool) -> Result<()> {
        if moved {
            self.dir_index(io, dir)?;
            // Its `..` changes: reserved with the rest, before the first change.
            self.reserve_unindex(io, dir)?;
        }
        Ok(())
    }

    /// Releases everything an unused inode holds, and the inode.
    pub(crate) fn free_inode_fully(&mut self, io: &Io, ino: u32) -> Result<()> {
        let mut i = self.read_inode(io, ino)?;
        self.fetch_for_free(io, ino, &i)?;
        // Data still in the page cache never reaches the device.
        self.data.lock().drop_file(ino);
        let is_dir = i.is_dir();
        // Directory and slow-symlink blocks are logged like metadata: they need revokes.
        let logged = is_dir || i.is_symlink();
        if i.flags() & flags::EXTENTS != 0 {
            let mut map = self.take_extent_map(io, ino, &i)?;
            for (start, len) in map.truncate_from(0) {
                self.free_run(io, start, u64::from(len), logged)?;
            }
            for b in map.take_tree_blocks() {
                self.free_block(io, b, true)?;
            }
        }
        if let Some(acl) = self.xattr_block(ino, &i)? {
            self.release_xattr_block(io, acl)?;
        }
        self.derived.maps.remove(&ino);
        self.forget_inode_entirely(ino);
        self.derived.modes.forget(ino);
        self.remove_orphan(io, ino)?;
        let mut dead = Inode::new_zeroed(self.geo.inode_size as usize, self.geo.extra_isize);
        dead.set_dtime(now().sec as u32);
        dead.set_generation(i.generation());
        i = dead;
        self.write_inode(io, ino, &mut i)?;
        self.free_inode(io, ino, is_dir)
    }

    fn release_xattr_block(&mut self, io: &Io, blk: u64) -> Result<()> {
        let b = self.block(io, blk)?;
        let refs = xattr::block_refcount(b);
        if refs > 1 {
            // Shared with other inodes: drop this one's reference.
            let seed = self.geo.csum_seed;
            let b = self.block_mut(io, blk)?;
            xattr::set_block_refcount(b, refs - 1, seed, blk);
            Ok(())
        } else {
            self.free_block(io, blk, true)
        }
    }

    fn remove_orphan(&mut self, io: &Io, ino: u32) -> Result<()> {
        // The list runs through inodes written in place otherwise: a cut between the head
        // (journaled) or the previous orphan and this one would break it.
        self.changes_names();
        let Some(before) = self.orphan_link(io, ino)? else {
            return Ok(());
        };
        let next = self.stored_inode(io, ino)?.dtime();
        match before {
            None => {
                self.sb.set_last_orphan(next);
                self.sb_dirty = true;
                Ok(())
            }
            Some(prev) => {
                let mut pi = self.read_inode(io, prev)?;
                pi.set_dtime(next);
                self.write_inode(io, prev, &mut pi)
            }
        }
    }

    /// Where `ino` sits on the orphan list: `Some(None)` at its head, `Some(Some(prev))`
    /// after orphan `prev`, `None` when it is not on it. Changes nothing and reads every inode
    /// up to it and its own, so an operation that will take `ino` off the list calls it before
    /// its first change too (docs/DESIGN.md §4.1, fetch before change).
    fn orphan_link(&mut self, io: &Io, ino: u32) -> Result<Option<Option<u32>>> {
        let head = self.sb.last_orphan();
        if head == 0 {
            return Ok(None);
        }
        let mut before = None;
        let mut cur = head;
        for _ in 0..self.sb.inodes_count() {
            // As stored: writes without the lock change sizes and times, never `i_dtime`.
            let next = self.stored_inode(io, cur)?.dtime();
            if cur == ino {
                return Ok(Some(before));
            }
            if next == 0 {
                break;
            }
            before = Some(cur);
            cur = next;
        }
        Ok(None)
    }

    /// Removes a non-directory entry.
    pub(crate) fn unlink(&mut self, io: &Io, parent: u32, name: &[u8]) -> Result<()> {
        self.dir_inode(io, parent)?;
        check_name(name)?;
        let slot = self
            .dir_lookup_to_change(io, parent, name)?
            .ok_or(FsError::NotFound)?;
        let i = self.read_inode(io, slot.ino)?;
        if i.is_dir() {
            return Err(FsError::IsDir);
        }
        self.acts_for(io, parent)?;
        self.acts_for(io, slot.ino)?;
        self.changes_names();
        if i.links_count() <= 1 && !self.open.contains(slot.ino) {
            self.fetch_for_free(io, slot.ino, &i)?;
        }
        self.dir_remove(io, parent, name)?;
        self.touch_dir(io, parent)?;
        self.drop_link(io, slot.ino)
    }

    /// Removes an empty directory.
    pub(crate) fn rmdir(&mut self, io: &Io, parent: u32, name: &[u8]) -> Result<()> {
        self.dir_inode(io, parent)?;
        if name == b"." {
            return Err(FsError::Invalid("cannot remove '.'"));
        }
        if name == b".." {
            return Err(FsError::NotEmpty);
        }
        check_name(name)?;
        let slot = self
            .dir_lookup_to_change(io, parent, name)?
            .ok_or(FsError::NotFound)?;
        let i = self.read_inode(io, slot.ino)?;
        if !i.is_dir() {
            return Err(FsError::NotDir);
        }
        if !self.dir_is_empty(io, slot.ino)? {
            return Err(FsError::NotEmpty);
        }
        self.acts_for(io, parent)?;
        self.acts_for(io, slot.ino)?;
        self.changes_names();
        if !self.open.contains(slot.ino) {
            self.fetch_for_free(io, slot.ino, &i)?;
        }
        self.dir_remove(io, parent, name)?;
        self.drop_dir(io, parent, slot.ino)
    }

    /// Frees an empty directory `ino` already unlinked from `parent`, fixing `parent`'s links.
    fn drop_dir(&mut self, io: &Io, parent: u32, ino: u32) -> Result<()> {
        let mut i = self.read_inode(io, ino)?;
        i.set_links_count(0);
        i.set_ctime(now());
        self.write_inode(io, ino, &mut i)?;
        let mut pi = self.read_inode(io, parent)?;
        let l = pi.links_count();
        if l > 2 {
            pi.set_links_count(l - 1);
        }
        let t = now();
        pi.set_mtime(t);
        pi.set_ctime(t);
        self.write_inode(io, parent, &mut pi)?;
        if self.open.last_link_dropped(ino, &self.names) {
            i.set_dtime(self.sb.last_orphan());
            self.sb.set_last_orphan(ino);
            self.sb_dirty = true;
            self.write_inode(io, ino, &mut i)
        } else {
            self.free_inode_fully(io, ino)
        }
    }

    /// Whether `ancestor` is `dir` or one of its ancestors.
    fn is_ancestor(&mut self, io: &Io, ancestor: u32, dir: u32) -> Result<bool> {
        let mut cur = dir;
        for _ in 0..100_000 {
            if cur == ancestor {
                return Ok(true);
            }
            if cur == super::api::ROOT_INO as u32 {
                return Ok(false);
            }
            cur = self
                .dir_lookup(io, cur, b"..")?
                .map_or(super::api::ROOT_INO as u32, |s| s.ino);
        }
        Err(FsError::corrupt("directory tree loops"))
    }

    fn adjust_links(&mut self, io: &Io, ino: u32, delta: i32) -> Result<()> {
        let mut i = self.read_inode(io, ino)?;
        let l = i.links_count();
        let nl = if delta > 0 {
            dir_nlink_inc(l)
        } else if l > 2 {
            l - 1
        } else {
            l
        };
        i.set_links_count(nl);
        let t = now();
        i.set_mtime(t);
        i.set_ctime(t);
        self.write_inode(io, ino, &mut i)
    }

    /// Renames, replaces or exchanges entries.
    pub(crate) fn rename(
        &mut self,
        io: &Io,
        parent: u32,
        name: &[u8],
        new_parent: u32,
        new_name: &[u8],
        fl: RenameFlags,
    ) -> Result<()> {
        if fl.exchange && fl.noreplace {
            return Err(FsError::Invalid("RENAME_EXCHANGE with RENAME_NOREPLACE"));
        }
        self.dir_inode(io, parent)?;
        self.dir_inode(io, new_parent)?;
        check_name(name)?;
        check_name(new_name)?;
        if dirent::is_dot_or_dotdot(name) || dirent::is_dot_or_dotdot(new_name) {
            return Err(FsError::Invalid("cannot rename '.' or '..'"));
        }
        let src = self
            .dir_lookup_to_change(io, parent, name)?
            .ok_or(FsError::NotFound)?;
        let dst = self.dir_lookup_to_change(io, new_parent, new_name)?;
        let si = self.read_inode(io, src.ino)?;
        let src_dir = si.is_dir();
        for ino in [parent, new_parent, src.ino]
            .into_iter()
            .chain(dst.map(|d| d.ino))
        {
            self.acts_for(io, ino)?;
        }
        if dst.is_none() && !fl.exchange {
            // The name is added to `new_parent`.
            self.check_dir_tail(io, new_parent)?;
        }
        self.changes_names();
        // After the checks, before the first change: room for a new directory block and its
        // tree block, and for the mode records of what moves to another directory.
        let moves: Vec<(u32, u32)> = if parent == new_parent {
            Vec::new()
        } else if fl.exchange {
            std::iter::once((src.ino, new_parent))
                .chain(dst.map(|d| (d.ino, parent)))
                .collect()
        } else {
            vec![(src.ino, new_parent)]
        };
        let check_space = |m: &mut Meta| {
            let records = m.relink_blocks(io, &moves)?;
            m.ensure_space(2 + records)
        };
        if fl.exchange {
            let dst = dst.ok_or(FsError::NotFound)?;
            let di = self.read_inode(io, dst.ino)?;
            let dst_dir = di.is_dir();
            if parent != new_parent {
                if src_dir && self.is_ancestor(io, src.ino, new_parent)? {
                    return Err(FsError::Invalid("cannot move a directory into itself"));
                }
                if dst_dir && self.is_ancestor(io, dst.ino, parent)? {
                    return Err(FsError::Invalid("cannot move a directory into itself"));
                }
                self.fetch_moved_dir(io, src.ino, src_dir)?;
                self.fetch_moved_dir(io, dst.ino, dst_dir)?;
            }
            check_space(self)?;
            self.dir_retarget(io, parent, name, dst.ino, dst.file_type)?;
            self.dir_retarget(io, new_parent, new_name, src.ino, src.file_type)?;
            if parent != new_parent {
                if src_dir {
                    self.dir_retarget(io, src.ino, b"..", new_parent, ft::DIR)?;
                }
                if dst_dir {
                    self.dir_retarget(io, dst.ino, b"..", parent, ft::DIR)?;
                }
                if src_dir != dst_dir {
                    let (gain, lose) = if src_dir {
                        (new_parent, parent)
                    } else {
                        (parent, new_parent)
                    };
                    self.adjust_links(io, gain, 1)?;
                    self.adjust_links(io, lose, -1)?;
                }
            }
            for (ino, dir) in [(src.ino, new_parent), (dst.ino, parent)] {
                let mut i = self.read_inode(io, ino)?;
                i.set_ctime(now());
                if parent != new_parent {
                    self.relink_mode(io, ino, &mut i, dir)?;
                }
                self.write_inode(io, ino, &mut i)?;
            }
            self.touch_dir(io, parent)?;
            return self.touch_dir(io, new_parent);
        }
        if src_dir && self.is_ancestor(io, src.ino, new_parent)? {
            return Err(FsError::Invalid("cannot move a directory into itself"));
        }
        if let Some(d) = dst {
            if fl.noreplace {
                return Err(FsError::Exists);
            }
            if d.ino == src.ino {
                return Ok(());
            }
            let di = self.read_inode(io, d.ino)?;
            if src_dir && !di.is_dir() {
                return Err(FsError::NotDir);
            }
            if !src_dir && di.is_dir() {
                return Err(FsError::IsDir);
            }
            if di.is_dir() && !self.dir_is_empty(io, d.ino)? {
                return Err(FsError::NotEmpty);
            }
            check_space(self)?;
            if (di.is_dir() || di.links_count() <= 1) && !self.open.contains(d.ino) {
                self.fetch_for_free(io, d.ino, &di)?;
            }
            self.fetch_moved_dir(io, src.ino, src_dir && parent != new_parent)?;
            self.dir_retarget(io, new_parent, new_name, src.ino, src.file_type)?;
            self.dir_remove(io, parent, name)?;
            if di.is_dir() {
                self.drop_dir(io, new_parent, d.ino)?;
            } else {
                self.drop_link(io, d.ino)?;
            }
        } else {
            check_space(self)?;
            self.fetch_moved_dir(io, src.ino, src_dir && parent != new_parent)?;
            self.dir_add(io, new_parent, new_name, src.ino, src.file_type)?;
            self.dir_remove(io, parent, name)?;
        }
        if src_dir && parent != new_parent {
            self.dir_retarget(io, src.ino, b"..", new_parent, ft::DIR)?;
            self.adjust_links(io, new_parent, 1)?;
            self.adjust_links(io, parent, -1)?;
        }
        let mut i = self.read_inode(io, src.ino)?;
        i.set_ctime(now());
        if parent != new_parent {
            self.relink_mode(io, src.ino, &mut i, new_parent)?;
        }
        self.write_inode(io, src.ino, &mut i)?;
        self.touch_dir(io, parent)?;
        if parent != new_parent {
            self.touch_dir(io, new_parent)?;
        }
        Ok(())
    }

    // ----- attributes -----

    /// Removes the file capabilities (`security.capability`) of regular file `ino`, as the
    /// kernel does when a file is written, truncated or given another owner: what they were
    /// granted to is no longer what the file holds.
    pub(crate) fn kill_caps(&mut self, io: &Io, ino: u32) -> Result<()> {
        let i = self.live_inode(io, ino)?;
        if !i.is_reg() {
            return Ok(());
        }
        let has_caps = self
            .load_xattrs(io, ino, &i)?
            .iter()
            .any(|a| a.index == xattr::INDEX_SECURITY && a.name == CAPABILITY_NAME);
        if !has_caps {
            return Ok(());
        }
        self.removexattr(io, ino, b"security.capability")
    }

    /// Clears the set-user-ID bit of `ino`, and its set-group-ID bit when the group may
    /// execute it (without that bit set-group-ID means mandatory locking and stays), as the
    /// kernel does when a caller without `CAP_FSETID` writes or truncates a file, and on
    /// every change of owner.
    pub(crate) fn kill_suidgid(&mut self, io: &Io, ino: u32) -> Result<()> {
        let mut i = self.live_inode(io, ino)?;
        let m = i.mode();
        let kept = without_set_id(m);
        if kept == m {
            return Ok(());
        }
        i.set_mode(kept);
        i.set_ctime(now());
        self.write_inode(io, ino, &mut i)
    }

    /// Applies attribute changes.
    pub(crate) fn setattr(&mut self, io: &Io, ino: u32, c: &SetAttr) -> Result<Attr> {
        self.acts_for(io, ino)?;
        let i = self.live_inode(io, ino)?;
        if let Some(size) = c.size {
            if i.is_dir() {
                return Err(FsError::IsDir);
            }
            if !i.is_reg() {
                return Err(FsError::Invalid("size of a special file"));
            }
            // Before the capabilities go, which is a change already.
            self.fetch_for_truncate(io, ino, &i, size)?;
        }
        if c.size.is_some() || c.uid.is_some() || c.gid.is_some() {
            self.kill_caps(io, ino)?;
        }
        let mut i = self.live_inode(io, ino)?;
        let t = now();
        if let Some(size) = c.size {
            self.truncate(io, ino, &mut i, size)?;
            i.set_mtime(t);
        }
        if let Some(m) = c.mode {
            i.set_mode((i.mode() & mode::S_IFMT) | (m & 0o7777));
        }
        if let Some(uid) = c.uid {
            i.set_uid(uid);
        }
        if let Some(gid) = c.gid {
            i.set_gid(gid);
        }
        let at = |s: SetTime| match s {
            SetTime::Now => t,
            SetTime::At(ts) => from_ts(ts),
        };
        if let Some(a) = c.atime {
            i.set_atime(at(a));
        }
        if let Some(m) = c.mtime {
            i.set_mtime(at(m));
        }
        i.set_ctime(c.ctime.map_or(t, from_ts));
        self.write_inode(io, ino, &mut i)?;
        if c.size.is_some() {
            // A truncate took the map out; the writes that usually follow it (`O_TRUNC`, then
            // a rewrite) need not take the lock. No capabilities are left (`kill_caps`).
            self.allow_cached_writes(io, ino, &i)?;
        }
        Ok(self.attr(ino, &i))
    }

    // ----- file data -----

    /// Reads file block `home` (a block written on disk) as it is now: the newest copy not yet
    /// at home (journal-mode data in the buffer cache or the journal), else the home location.
    fn read_data_block(&mut self, io: &Io, home: u64) -> Result<Arc<[u8]>> {
        self.read_data_blocks(io, &[home])?
            .pop()
            .ok_or(FsError::Invalid("no block read"))
    }

    /// [`Meta::read_data_block`] of several blocks, in the order given: those in no memory
    /// copy are read in one stop.
    fn read_data_blocks(&mut self, io: &Io, homes: &[u64]) -> Result<Vec<Arc<[u8]>>> {
        let copies: Vec<Option<Arc<[u8]>>> =
            homes.iter().map(|&h| self.unsettled_copy(io, h)).collect();
        let missing: Vec<u64> = homes
            .iter()
            .zip(&copies)
            .filter(|(_, c)| c.is_none())
            .map(|(&h, _)| h)
            .collect();
        let mut read = self.read_homes(io, &missing)?.into_iter();
        copies
            .into_iter()
            .map(|c| match c {
                Some(copy) => Ok(copy),
                None => read
                    .next()
                    .map(Arc::from)
                    .ok_or(FsError::Invalid("fewer blocks read than asked for")),
            })
            .collect()
    }

    /// Puts `bytes` at `offset` of file block `lblk` of `ino` through the page cache. A block
    /// written on disk is read into its page first unless the change covers it whole; a hole
    /// or an unwritten block starts as zeros (a hole's page holds a reserved block).
    fn put_data(&mut self, io: &Io, ino: u32, piece: Piece<'_>) -> Result<()> {
        let Piece {
            lblk,
            home,
            offset,
            bytes,
            request_len,
            old,
            whole,
        } = piece;
        let mode = self.data_mode(io, ino)?;
        // Each attempt finds the page and writes into it under one hold of the page cache's
        // mutex: a read of another file fetching blocks without the metadata lock may evict
        // a clean page this operation has not touched yet (never one it has touched).
        if self
            .data
            .lock()
            .write_page(ino, lblk, offset, bytes, request_len, mode, whole)
        {
            return Ok(());
        }
        let bs = self.geo.bs();
        let page = match (old, home, whole) {
            (Some(old), _, _) => old,
            (None, Some((p, false)), _) if bytes.len() < bs => self.read_data_block(io, p)?,
            // The write below makes it the page anyway.
            (None, _, Some(whole)) => Arc::clone(whole),
            _ => zero_page(bs),
        };
        let mut pages = self.data.lock();
        pages.insert(ino, lblk, page, home.is_none());
        let written = pages.write_page(ino, lblk, offset, bytes, request_len, mode, whole);
        debug_assert!(written, "a page just inserted is cached");
        Ok(())
    }

    /// Plans a read (`fs/read_plan.rs`), clipped to the file size. On a mount where no file
    /// data is journaled, the file's block map is published for reads without the metadata
    /// lock, with its attributes (`Fs::read`).
    pub(crate) fn read_plan(
        &mut self,
        io: &Io,
        ino: u32,
        offset: u64,
        size: u32,
    ) -> Result<Vec<ReadSegment>> {
        let i = self.live_inode(io, ino)?;
        if i.is_dir() {
            return Err(FsError::IsDir);
        }
        if !i.is_reg() {
            // Only a regular file's size is bounded by what its block map can address.
            return Err(FsError::Invalid("read of a special file"));
        }
        let fsize = i.size();
        if offset >= fsize || size == 0 {
            return Ok(Vec::new());
        }
        let end = fsize.min(offset.saturating_add(u64::from(size)));
        let map = self.shared_extent_map(io, ino, &i)?;
        let segs = {
            let mut pages = self.data.lock();
            let segs = read_plan::plan(
                &map,
                &mut pages,
                ino,
                offset,
                end,
                self.geo.block_size,
                |p| self.unsettled_copy(io, p),
            );
            pages.publish_map(ino, map);
            segs
        };
        // Later reads of this file may be served without the metadata lock (`Fs::read`).
        self.attr_cached(ino, &i, false);
        Ok(segs)
    }

    /// Blocks kept back from what writes may reserve, for extent-tree growth at write-back.
    fn reservation_margin(&self) -> u64 {
        8 + self.data.lock().reserved() / 64
    }

    /// Lets the next writes of `ino` (as `i`, just stored by this operation, which found or
    /// left it without capabilities) go into its cached pages without the metadata lock
    /// (`Fs::write`, docs/DESIGN.md §2.5) once this operation ends well: a regular file whose
    /// times round-trip exactly gets its mode published, its attributes cached when the
    /// operation ends, and its block map published with spare blocks set aside, so that those
    /// writes find the holes they may fill and blocks to reserve for them. Called by a write,
    /// a truncate (whose change took the map out) and a create; a fallocate, punch-hole or
    /// zero-range leaves the map out (the next write under the lock publishes it).
    fn allow_cached_writes(&mut self, io: &Io, ino: u32, i: &Inode) -> Result<()> {
        if !i.is_reg() || !i.keeps_nanoseconds() {
            return Ok(());
        }
        let mode = self.data_mode(io, ino)?;
        self.extent_map(io, ino, i)?;
        self.publish_extent_map(ino);
        match self.op.undo.as_mut() {
            // The spare is topped up when the operation ends well (`Meta::end_op`): one
            // taken back would put back the reservations it dropped, and a spare counted
            // from the room they had left would promise blocks that are not there.
            Some(u) => {
                u.publish_write = Some((ino, mode));
                u.forgot.insert(ino, Some(i.clone()));
            }
            None => self.top_up_spare_with_margin(0),
        }
        Ok(())
    }

    /// [`Meta::top_up_spare`] to [`SPARE_BLOCKS`] (or `more` beyond what is set aside, if
    /// that is more), beyond the margin the page cache's reservations call for.
    pub(super) fn top_up_spare_with_margin(&self, more: u64) {
        let margin = self.reservation_margin();
        let target = SPARE_BLOCKS.max(self.data.lock().spare() + more);
        self.top_up_spare(target, margin);
    }

    /// Writes file data into the page cache (delayed allocation: blocks are allocated and
    /// data reaches the device at write-back, `fs/writeback.rs`). Pages over holes reserve a
    /// block each; when space runs out part-way, the blocks that fit are written and the
    /// write is short, as POSIX allows.
    pub(crate) fn write(
        &mut self,
        io: &Io,
        ino: u32,
        offset: u64,
        data: &[u8],
        request_len: usize,
        whole: &WholePages,
    ) -> Result<u32> {
        if !data.is_empty() {
            self.kill_caps(io, ino)?;
        }
        let mut i = self.live_inode(io, ino)?;
        if i.is_dir() {
            return Err(FsError::IsDir);
        }
        if !i.is_reg() {
            // A symbolic link's target is no file data (a slow link's block holds it), and
            // device nodes, fifos and sockets have none.
            return Err(FsError::Invalid("write to a special file"));
        }
        if data.is_empty() {
            return Ok(0);
        }
        let bs = u64::from(self.geo.block_size);
        let end = offset
            .checked_add(data.len() as u64)
            .ok_or(FsError::FileTooBig)?;
        if end.div_ceil(bs) > self.geo.max_file_blocks() {
            return Err(FsError::FileTooBig);
        }
        // The bound above keeps logical block numbers within u32.
        let (first, last) = ((offset / bs) as u32, ((end - 1) / bs) as u32);
        let map = self.extent_map(io, ino, &i)?;
        let homes: Vec<Option<(u64, bool)>> = (first..=last).map(|l| map.map(l)).collect();
        let margin = self.reservation_margin();
        let mut room = self
            .allocatable_blocks_for(margin + u64::from(last - first) + 1)
            .saturating_sub(margin);
        // The old bytes of the edge blocks the write covers in part, written on disk and not
        // cached, read before any page is filled and in one stop: a stop for them then takes
        // back no page (docs/DESIGN.md §4.1), and a write whose two edges are cold waits for
        // one round of reads, not one per edge. The last is not read when space runs out
        // before the write gets there. (A write of one block reads it when it fills it, which
        // is before any other page too.)
        let (first_home, last_home) = {
            let pages = self.data.lock();
            let cold = |k: usize, lblk: u32| match homes[k] {
                Some((p, false)) if pages.get(ino, lblk).is_none() => Some(p),
                _ => None,
            };
            let first_home = (last > first && offset % bs != 0)
                .then(|| cold(0, first))
                .flatten();
            let last_home = (last > first && end % bs != 0)
                .then(|| cold(homes.len() - 1, last))
                .flatten()
                .filter(|_| {
                    let holes = homes
                        .iter()
                        .zip(first..)
                        .filter(|(h, l)| h.is_none() && pages.get(ino, *l).is_none())
                        .count();
                    holes as u64 <= room
                });
            (first_home, last_home)
        };
        let wanted: Vec<u64> = [first_home, last_home].into_iter().flatten().collect();
        let mut edges = self.read_data_blocks(io, &wanted)?.into_iter();
        let mut first_old = first_home.and_then(|_| edges.next());
        let mut last_old = last_home.and_then(|_| edges.next());
        let mut pos = offset;
        let mut written = 0usize;
        for (k, home) in homes.into_iter().enumerate() {
            let lblk = first + k as u32;
            if home.is_none() && self.data.lock().get(ino, lblk).is_none() {
                if room == 0 {
                    break;
                }
                room -= 1;
            }
            let in_block = (pos % bs) as usize;
            let len = ((bs as usize) - in_block).min((end - pos) as usize);
            let piece = Piece {
                lblk,
                home,
                offset: in_block,
                bytes: &data[written..written + len],
                request_len,
                old: if lblk == last {
                    last_old.take()
                } else if lblk == first {
                    first_old.take()
                } else {
                    None
                },
                whole: whole.get(lblk),
            };
            self.put_data(io, ino, piece)?;
            pos += len as u64;
            written += len;
        }
        if written == 0 {
            return Err(FsError::NoSpace);
        }
        if pos > i.size() {
            i.set_size(pos);
        }
        let t = self.change_time(ino, &i);
        i.set_mtime(t);
        i.set_ctime(t);
        self.write_inode(io, ino, &mut i)?;
        // The file has no capabilities left (`kill_caps` above).
        self.allow_cached_writes(io, ino, &i)?;
        // At most the request, itself at most u32::MAX from FUSE.
        Ok(written as u32)
    }

    /// The mtime and ctime a write gives inode `ino`, as Linux's multigrain timestamps do
    /// (since 6.13; ext4 among them): the fine clock when its times were handed out since
    /// they last changed, so whoever looked sees the write as newer; otherwise the coarse
    /// clock, or the inode's ctime when the coarse clock is not after it. So a run of writes
    /// that nobody stats in between leaves the inode unchanged after the first, and an fsync
    /// then has no metadata to commit.
    fn change_time(&mut self, ino: u32, i: &Inode) -> InodeTime {
        // First the cached attributes go (under the name cache's write lock): a reader that
        // was handed them has marked the times seen by then (`NameCache::attr` does both
        // under its read lock), so the test below sees that look; a later reader misses the
        // cache and waits for this operation.
        self.forget_attr_in_op(ino);
        let unseen = self.names.changed_unseen(ino);
        let t = change_time_after(unseen, i.ctime());
        self.names.times_changed(ino);
        if let Some(u) = &mut self.op.undo {
            u.times.push((ino, unseen));
        }
        t
    }

    /// Fetches what a truncate of `ino` (now `i`) to `size` will change, before its first
    /// change (docs/DESIGN.md §4.1): the bitmaps and descriptors of the groups the cut frees
    /// into and the partial last block it keeps.
    fn fetch_for_truncate(&mut self, io: &Io, ino: u32, i: &Inode, size: u64) -> Result<()> {
        let bs = u64::from(self.geo.block_size);
        let old = i.size();
        if size <= old {
            let runs = self.runs_from(io, ino, i, size.div_ceil(bs), u64::MAX)?;
            self.fetch_bitmaps(io, ino, &runs, None)?;
            if size < old {
                self.fetch_for_range(io, ino, i, (size, size), (true, false))?;
            }
        }
        Ok(())
    }

    /// Sets the size of a regular file: frees blocks past the end and zeroes the tail of the
    /// last partial block, so a later extension reads zeros.
    pub(crate) fn truncate(&mut self, io: &Io, ino: u32, i: &mut Inode, size: u64) -> Result<()> {
        let bs = u64::from(self.geo.block_size);
        if size.div_ceil(bs) > self.geo.max_file_blocks() {
            return Err(FsError::FileTooBig);
        }
        let old = i.size();
        self.fetch_for_truncate(io, ino, i, size)?;
        // Cached pages past the new end never reach the device.
        self.data
            .lock()
            .drop_range(ino, size.div_ceil(bs), u64::MAX);
        let mut map = self.take_extent_map(io, ino, i)?;
        // The bound above keeps it within u32.
        let tail_lblk = (size / bs) as u32;
        let tail_home = map.map(tail_lblk);
        // Drop blocks past the new end (also unwritten ones past EOF when shrinking).
        if size <= old {
            self.free_tail(io, ino, i, &mut map, size.div_ceil(bs) as u32)?;
        }
        self.put_extent_map(ino, map);
        i.set_size(size);
        // Zero the tail of the new last block, so a later extension reads zeros.
        if size < old {
            self.zero_tail(io, ino, size, tail_home)?;
        }
        Ok(())
    }

    /// Zeroes the bytes of file `ino` (now `i`, with extents) past its size in its last
    /// block, where that block holds data.
    fn zero_past_eof(&mut self, io: &Io, ino: u32, i: &Inode) -> Result<()> {
        let bs = u64::from(self.geo.block_size);
        let size = i.size();
        if size % bs == 0 {
            return Ok(());
        }
        self.fetch_for_range(io, ino, i, (size, size), (true, false))?;
        // The size is within the largest file, so its block is within u32.
        let tail_home = self.extent_map(io, ino, i)?.map((size / bs) as u32);
        self.zero_tail(io, ino, size, tail_home)
    }

    /// Zeroes the bytes of the block holding byte `size` of `ino` from there to its end, where
    /// the block holds data (cached, or written at `tail_home`).
    fn zero_tail(
        &mut self,
        io: &Io,
        ino: u32,
        size: u64,
        tail_home: Option<(u64, bool)>,
    ) -> Result<()> {
        let bs = u64::from(self.geo.block_size);
        if size % bs == 0 {
            return Ok(());
        }
        // Callers keep the size within the largest file.
        self.zero_in_block(io, ino, (size / bs) as u32, tail_home, size % bs, bs)
    }

    /// Zeroes bytes `from..to` of logical block `lblk` of `ino` (mapped at `home`) where the
    /// block holds data: a cached page, or a written extent. A hole or an unwritten extent
    /// reads as zeros already.
    fn zero_in_block(
        &mut self,
        io: &Io,
        ino: u32,
        lblk: u32,
        home: Option<(u64, bool)>,
        from: u64,
        to: u64,
    ) -> Result<()> {
        let cached = self.data.lock().get(ino, lblk).is_some();
        if cached || matches!(home, Some((_, false))) {
            let zeros = vec![0u8; (to - from) as usize];
            self.put_data(io, ino, Piece::zeros(lblk, home, from as usize, &zeros))?;
        }
        Ok(())
    }

    /// Frees the blocks of `map` (the map of `ino`, now `i`) from logical block `from` on,
    /// stores the map and counts them out of `i`.
    fn free_tail(
        &mut self,
        io: &Io,
        ino: u32,
        i: &mut Inode,
        map: &mut ExtentMap,
        from: u32,
    ) -> Result<()> {
        let bs = u64::from(self.geo.block_size);
        let freed = map.truncate_from(from);
        let mut n = 0u64;
        for (start, len) in freed {
            self.free_run(io, start, u64::from(len), false)?;
            n += u64::from(len);
        }
        map.store(self, io, ino, i)?;
        i.set_blocks_512(
            i.blocks_512(self.geo.block_size)
                .saturating_sub(n * (bs / 512)),
        );
        Ok(())
    }

    /// How many block groups one transaction may free blocks in: each costs a bitmap and
    /// part of a descriptor block, and the transaction must keep room for the rest.
    fn free_budget_groups(io: &Io) -> usize {
        (io.journal.max_transaction_blocks() / 8).max(4)
    }

    /// The logical block from which freeing the blocks of `map` in `[from, to)` stays within
    /// `groups` block groups, walking down from `to`: `from` when all of them fit.
    fn free_cut(&self, map: &ExtentMap, [from, to]: [u64; 2], groups: usize) -> u64 {
        let mut seen = std::collections::BTreeSet::new();
        for e in map.extents().iter().rev() {
            let l0 = u64::from(e.logical);
            if l0 >= to {
                continue;
            }
            let l1 = (l0 + u64::from(e.len)).min(to);
            if l1 <= from {
                break;
            }
            let lo = l0.max(from);
            let mut l = l1;
            while l > lo {
                let g = self.geo.group_of_block(e.physical + (l - 1 - l0));
                if seen.insert(g) && seen.len() > groups {
                    return l;
                }
                // The first block of this extent in group `g`.
                let g_first = self.geo.group_first_block(g);
                l = lo.max(l0 + g_first.saturating_sub(e.physical));
            }
        }
        from
    }

    /// Whether freeing all of `ino` (now `i`) touches more block groups than one transaction
    /// carries, so that it must be freed in steps.
    fn too_big_to_free_at_once(&mut self, io: &Io, ino: u32, i: &Inode) -> Result<bool> {
        Ok(self.step_cut(io, ino, i, [0, u64::MAX])? > 0)
    }

    /// [`Meta::free_cut`] of `ino` (now `i`) in the logical blocks `[from, to)` with one
    /// transaction's budget of groups; `from` for an inode without extents.
    fn step_cut(&mut self, io: &Io, ino: u32, i: &Inode, [from, to]: [u64; 2]) -> Result<u64> {
        if i.flags() & flags::EXTENTS == 0 {
            return Ok(from);
        }
        let groups = Self::free_budget_groups(io);
        let map = self.shared_extent_map(io, ino, i)?;
        Ok(self.free_cut(&map, [from, to], groups))
    }

    /// One transaction's worth of what a truncate of regular file `ino` to `size` bytes frees
    /// (its blocks from `ceil(size / block)` on, past the end too): frees from the end of the
    /// file down to where one transaction's budget of groups ends ([`Meta::free_cut`]), and
    /// brings the size down to there if it was larger. Returns true when what is left fits
    /// one transaction (then nothing was done: the caller's own operation frees it).
    pub(crate) fn shrink_step(&mut self, io: &Io, ino: u32, size: u64) -> Result<bool> {
        let mut i = self.read_inode(io, ino)?;
        let bs = u64::from(self.geo.block_size);
        // Only a cut frees (a size that grows keeps blocks past the end, as truncate does).
        if i.flags() & flags::EXTENTS == 0 || !i.is_reg() || size > i.size() {
            return Ok(true);
        }
        let from = size.div_ceil(bs);
        let cut = self.step_cut(io, ino, &i, [from, u64::MAX])?;
        if cut <= from {
            return Ok(true);
        }
        // What it frees, fetched before the first change (docs/DESIGN.md §4.1).
        let runs = self.runs_from(io, ino, &i, cut, u64::MAX)?;
        self.fetch_bitmaps(io, ino, &runs, None)?;
        self.data.lock().drop_range(ino, cut, u64::MAX);
        let mut map = self.take_extent_map(io, ino, &i)?;
        // `free_cut` returns a logical block of the map, within u32.
        self.free_tail(io, ino, &mut i, &mut map, cut as u32)?;
        self.put_extent_map(ino, map);
        if i.size() > cut * bs {
            i.set_size(cut * bs);
        }
        let t = now();
        i.set_mtime(t);
        i.set_ctime(t);
        self.write_inode(io, ino, &mut i)?;
        Ok(false)
    }

    /// One step of freeing orphan `ino` (no links left): its blocks from the end as far as one
    /// transaction carries them, or, when the rest fits, everything it holds and the inode.
    /// Returns true when the inode is free.
    pub(crate) fn free_step(&mut self, io: &Io, ino: u32) -> Result<bool> {
        // Nobody can read it any more: its cached data never reaches the device.
        self.data.lock().drop_file(ino);
        if !self.shrink_step(io, ino, 0)? {
            return Ok(false);
        }
        self.free_inode_fully(io, ino)?;
        Ok(true)
    }

    /// One step of finishing an orphan that still has links, as the kernel's orphan cleanup
    /// does: ext4 puts a file on the list while a truncate or an extending write runs, and a
    /// crash leaves it there. Its blocks past its size are freed (in steps from the end, as
    /// a truncate's, when they are too many for one transaction), then it leaves the list and
    /// its link in it (`i_dtime`) is cleared. Returns true when it is off the list.
    pub(crate) fn finish_linked_orphan_step(&mut self, io: &Io, ino: u32) -> Result<bool> {
        let mut i = self.read_inode(io, ino)?;
        // Block pointers in `i_block` (an empty file's xattr block does not count).
        if i.is_reg() && i.flags() & flags::EXTENTS == 0 && i.i_block().iter().any(|&b| b != 0) {
            return Err(FsError::Incompatible(format!(
                "inode {ino}, a block-mapped file (ext2/ext3 layout), is on the orphan list \
                 with its links: tidefs cannot truncate it; run e2fsck -fy"
            )));
        }
        if i.is_reg() && i.flags() & flags::EXTENTS != 0 {
            let size = i.size();
            if !self.shrink_step(io, ino, size)? {
                return Ok(false);
            }
            i = self.read_inode(io, ino)?;
            self.truncate(io, ino, &mut i, size)?;
            // The kernel zeroes the last block past the size too (a crash may leave the bytes
            // a truncate cut there), so that a later extension reads zeros.
            self.zero_past_eof(io, ino, &i)?;
        }
        self.remove_orphan(io, ino)?;
        i.set_dtime(0);
        self.write_inode(io, ino, &mut i)?;
        Ok(true)
    }

    /// Allocates unwritten blocks for `[offset, offset+len)`.
    /// Allocates `[offset, offset+len)` of `ino` as unwritten blocks, as far as one
    /// transaction can carry: it stops once the running transaction holds three quarters of
    /// the largest one the journal takes (a range over thousands of groups dirties a bitmap
    /// and a descriptor block in each, more than a small journal holds at once). Returns the
    /// byte offset reached (the end, or a block boundary before it), for the caller to go on
    /// from after a commit.
    pub(crate) fn fallocate(
        &mut self,
        io: &Io,
        ino: u32,
        offset: u64,
        len: u64,
        keep_size: bool,
    ) -> Result<u64> {
        let (mut i, end) = self.allocating_range_target(io, ino, offset, len)?;
        let bs = u64::from(self.geo.block_size);
        self.fetch_for_range(io, ino, &i, (offset, end), (false, true))?;
        // One part: half the largest transaction's journal blocks, reserved before the first
        // change; the allocation stops where its changes would pass them.
        let part = io.journal.max_transaction_blocks() / 2;
        self.reserve_log(part)?;
        let mut map = self.take_extent_map(io, ino, &i)?;
        // `allocating_range_target` keeps both within u32.
        let (first, last) = ((offset / bs) as u32, end.div_ceil(bs) as u32);
        let (missing, reached) =
            self.allocate_unwritten(io, ino, &mut map, first, last, 8, Some(part))?;
        let reached = (u64::from(reached) * bs).clamp(offset, end);
        self.store_grown_map(
            io,
            ino,
            &mut i,
            map,
            missing,
            (!keep_size).then_some(reached),
        )?;
        i.set_ctime(now());
        if !keep_size {
            i.set_mtime(now());
        }
        self.write_inode(io, ino, &mut i)?;
        Ok(reached)
    }

    /// As [`Meta::range_target`], for an operation that allocates the range: its end must be
    /// within the largest file size.
    fn allocating_range_target(
        &mut self,
        io: &Io,
        ino: u32,
        offset: u64,
        len: u64,
    ) -> Result<(Inode, u64)> {
        let (i, end) = self.range_target(io, ino, offset, len)?;
        if end.div_ceil(u64::from(self.geo.block_size)) > self.geo.max_file_blocks() {
            return Err(FsError::FileTooBig);
        }
        Ok((i, end))
    }

    /// Stores `map`, which gained `missing` newly allocated blocks, as the map of `ino` and
    /// counts them in `i`; grows the size to `grow_to` when given and larger.
    fn store_grown_map(
        &mut self,
        io: &Io,
        ino: u32,
        i: &mut Inode,
        mut map: ExtentMap,
        missing: u64,
        grow_to: Option<u64>,
    ) -> Result<()> {
        map.store(self, io, ino, i)?;
        self.put_extent_map(ino, map);
        let bs = self.geo.block_size;
        i.set_blocks_512(i.blocks_512(bs) + missing * u64::from(bs / 512));
        if let Some(end) = grow_to.filter(|&e| e > i.size()) {
            i.set_size(end);
        }
        Ok(())
    }

    /// Checks that `ino` is a regular file for a range operation and returns it with the end
    /// of `[offset, offset+len)`.
    fn range_target(&mut self, io: &Io, ino: u32, offset: u64, len: u64) -> Result<(Inode, u64)> {
        let i = self.live_inode(io, ino)?;
        if i.is_dir() {
            return Err(FsError::IsDir);
        }
        if !i.is_reg() {
            return Err(FsError::NotSupported);
        }
        if len == 0 {
            return Err(FsError::Invalid("fallocate length 0"));
        }
        let end = offset.checked_add(len).ok_or(FsError::FileTooBig)?;
        Ok((i, end))
    }

    /// Zeroes the bytes of `[offset, end)` that fall in the partial blocks at its two edges,
    /// where those blocks hold data (cached, or written on disk), through the page cache.
    /// Holes and unwritten blocks read as zeros already. `map` is the file's map before the
    /// range operation changed it.
    fn zero_partial_edges(
        &mut self,
        io: &Io,
        ino: u32,
        map: &ExtentMap,
        offset: u64,
        end: u64,
    ) -> Result<()> {
        let bs = u64::from(self.geo.block_size);
        let mut edges = Vec::with_capacity(2);
        if offset % bs != 0 {
            edges.push((offset / bs, offset % bs, (end - offset / bs * bs).min(bs)));
        }
        if end % bs != 0 && (offset % bs == 0 || end / bs != offset / bs) {
            edges.push((end / bs, 0, end % bs));
        }
        for (lblk, from, to) in edges {
            // Blocks past the 32-bit logical space cannot hold data.
            let Ok(lblk) = u32::try_from(lblk) else {
                continue;
            };
            self.zero_in_block(io, ino, lblk, map.map(lblk), from, to)?;
        }
        Ok(())
    }

    /// Deallocates `[offset, offset+len)` (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE): whole
    /// blocks inside the range leave the extent tree and are freed (quarantined until the
    /// transaction commits, revoked where they may be in the journal), the partial blocks at
    /// its edges get zeros; the size stays. Preallocated blocks past the end of file inside the
    /// range are freed too. A range whose blocks lie in more groups than one transaction
    /// carries is first cut down by [`Meta::punch_step`].
    pub(crate) fn punch_hole(&mut self, io: &Io, ino: u32, offset: u64, len: u64) -> Result<()> {
        let Some((mut i, end)) = self.punch_target(io, ino, offset, len)? else {
            return Ok(());
        };
        let edges = self.punch_blocks(io, ino, &mut i, offset, end)?;
        self.write_inode(io, ino, &mut i)?;
        self.zero_partial_edges(io, ino, &edges, offset, end)
    }

    /// One transaction's worth of a punch of `[offset, offset+len)` too big for one: frees the
    /// whole blocks from the end of the range down to where one transaction's budget of groups
    /// ends ([`Meta::free_cut`]). Returns true when what is left fits one transaction (then
    /// nothing was done: [`Meta::punch_hole`] does the rest, edges included).
    pub(crate) fn punch_step(&mut self, io: &Io, ino: u32, offset: u64, len: u64) -> Result<bool> {
        let Some((mut i, end)) = self.punch_target(io, ino, offset, len)? else {
            return Ok(true);
        };
        let bs = u64::from(self.geo.block_size);
        let (from, to) = (offset.div_ceil(bs), end / bs);
        let cut = self.step_cut(io, ino, &i, [from, to])?;
        if cut <= from {
            return Ok(true);
        }
        self.punch_blocks(io, ino, &mut i, cut * bs, to * bs)?;
        self.write_inode(io, ino, &mut i)?;
        Ok(false)
    }

    /// The file a punch of `[offset, offset+len)` changes and the end of what it clears, or
    /// None when that is nothing. A range that reaches the end of file covers the whole last
    /// block: the bytes past the size are not part of the file, so that block can go too.
    fn punch_target(
        &mut self,
        io: &Io,
        ino: u32,
        offset: u64,
        len: u64,
    ) -> Result<Option<(Inode, u64)>> {
        let (i, end) = self.range_target(io, ino, offset, len)?;
        let bs = u64::from(self.geo.block_size);
        let end = if end >= i.size() {
            end.max(i.size().div_ceil(bs) * bs)
        } else {
            end
        };
        let end = end.min(self.geo.max_file_blocks() * bs);
        Ok((offset < end).then_some((i, end)))
    }

    /// Frees the whole blocks of `[offset, end)` of `ino` (now `i`, whose block count and
    /// times it updates; the caller writes it) and drops their cached pages. Returns the map's
    /// extents at the range's edges as they were, for [`Meta::zero_partial_edges`].
    fn punch_blocks(
        &mut self,
        io: &Io,
        ino: u32,
        i: &mut Inode,
        offset: u64,
        end: u64,
    ) -> Result<ExtentMap> {
        let bs = u64::from(self.geo.block_size);
        let (from, to) = (offset.div_ceil(bs), end / bs);
        // Splitting an extent may need a new tree block; find it before changing anything.
        self.ensure_space(4)?;
        let runs = self.runs_from(io, ino, i, from, to)?;
        self.fetch_bitmaps(io, ino, &runs, None)?;
        self.fetch_for_range(io, ino, i, (offset, end), (true, false))?;
        // ... which `ExtentMap::store` allocates near the file's last extent, when the hole
        // splits an extent in two (the only way a punch adds one).
        let map = self.shared_extent_map(io, ino, i)?;
        let splits = map
            .extents()
            .iter()
            .any(|e| u64::from(e.logical) < from && e.logical_end() > to);
        if splits {
            let goal = inode_goal(&map, self, ino);
            self.fetch_for_allocation(io, goal, 4)?;
        }
        let mut map = self.take_extent_map(io, ino, i)?;
        let edges = map.excerpt([offset / bs, end / bs]);
        self.data.lock().drop_range(ino, from, to);
        let freed = map.remove_range(from, to);
        let mut n = 0u64;
        for (start, run) in freed {
            self.free_run(io, start, u64::from(run), false)?;
            n += u64::from(run);
        }
        map.store(self, io, ino, i)?;
        self.put_extent_map(ino, map);
        i.set_blocks_512(
            i.blocks_512(self.geo.block_size)
                .saturating_sub(n * (bs / 512)),
        );
        let t = now();
        i.set_mtime(t);
        i.set_ctime(t);
        Ok(edges)
    }

    /// Makes `[offset, offset+len)` read as zeros and keeps it allocated
    /// (FALLOC_FL_ZERO_RANGE), as ext4 does: written blocks wholly inside become unwritten,
    /// the partial blocks at the edges get zeros through the data path, and holes in the range
    /// are allocated unwritten. The size grows to the end of the range unless `keep_size`.
    pub(crate) fn zero_range(
        &mut self,
        io: &Io,
        ino: u32,
        offset: u64,
        len: u64,
        keep_size: bool,
    ) -> Result<()> {
        let (mut i, end) = self.allocating_range_target(io, ino, offset, len)?;
        let bs = u64::from(self.geo.block_size);
        self.fetch_for_range(io, ino, &i, (offset, end), (true, true))?;
        // The holes left are few enough for half the groups one transaction frees in, were
        // the free blocks contiguous (`Meta::zero_range_step`), and the range's edges may
        // split two extents.
        self.reserve_log(free_credits(Self::free_budget_groups(io) / 2) + TREE_CREDITS)?;
        let mut map = self.take_extent_map(io, ino, &i)?;
        // `allocating_range_target` keeps both within u32.
        let (first, last) = ((offset / bs) as u32, end.div_ceil(bs) as u32);
        let edges = map.excerpt([offset / bs, end / bs]);
        // Whole blocks become unwritten: what their pages hold is zeroed, not written back.
        self.data
            .lock()
            .drop_range(ino, offset.div_ceil(bs), end / bs);
        map.mark_unwritten_range(offset.div_ceil(bs), end / bs);
        let (missing, _) = self.allocate_unwritten(io, ino, &mut map, first, last, 4, None)?;
        self.store_grown_map(io, ino, &mut i, map, missing, (!keep_size).then_some(end))?;
        let t = now();
        i.set_mtime(t);
        i.set_ctime(t);
        self.write_inode(io, ino, &mut i)?;
        self.zero_partial_edges(io, ino, &edges, offset, end)
    }

    /// One part of the allocation of a zero-range of `[offset, offset+len)` whose holes are
    /// more than one transaction carries: allocates them as [`Meta::fallocate`] does (size
    /// kept) up to the transaction's budget. Returns true when what is left is few enough
    /// for the zero-range itself (then nothing was done): at most half the groups of one
    /// transaction's budget, were the blocks contiguous.
    pub(crate) fn zero_range_step(
        &mut self,
        io: &Io,
        ino: u32,
        offset: u64,
        len: u64,
    ) -> Result<bool> {
        let (i, end) = self.allocating_range_target(io, ino, offset, len)?;
        let bs = u64::from(self.geo.block_size);
        // `allocating_range_target` keeps both within u32.
        let (first, last) = ((offset / bs) as u32, end.div_ceil(bs) as u32);
        let missing: u64 = {
            let map = self.shared_extent_map(io, ino, &i)?;
            map.holes(first, last)
                .iter()
                .map(|(a, b)| u64::from(b - a))
                .sum()
        };
        let few = Self::free_budget_groups(io) as u64 / 2 * u64::from(self.geo.blocks_per_group);
        if missing <= few {
            return Ok(true);
        }
        self.fallocate(io, ino, offset, len, true)?;
        Ok(false)
    }

    /// Maps every hole among logical blocks `[first, last)` of `map` to a new unwritten block,
    /// after checking that they and `spare` more (tree blocks) are available; returns how many
    /// were allocated and the logical block reached (`last`). With a `budget` of journal
    /// blocks (what the operation reserved for the allocation, `fs/log_credits.rs`), stops
    /// before the run that could take what the operation changed, with the extent-tree nodes
    /// its runs will need, past it (at least one run is allocated), and the block reached is
    /// where the holes left begin.
    #[allow(clippy::too_many_arguments)]
    fn allocate_unwritten(
        &mut self,
        io: &Io,
        ino: u32,
        map: &mut ExtentMap,
        first: u32,
        last: u32,
        spare: u64,
        budget: Option<usize>,
    ) -> Result<(u64, u32)> {
        let holes = map.holes(first, last);
        let missing: u64 = holes.iter().map(|(a, b)| u64::from(b - a)).sum();
        // Cached pages over the holes hold their blocks reserved already (and give them up
        // as the runs are allocated): counted once.
        let held: u64 = {
            let data = self.data.lock();
            holes
                .iter()
                .map(|&(a, b)| data.reserved_pages(ino, a, b).len() as u64)
                .sum()
        };
        self.ensure_space(missing.saturating_sub(held) + spare)?;
        let mut goal = inode_goal(map, self, ino);
        let mut allocated = 0u64;
        let (per, leaf) = (io.journal.revokes_per_block(), node_capacity(self.geo.bs()));
        // The extent-tree nodes the runs will need when the map is stored: the runs of one
        // hole fill leaves in turn, and each hole may lie in a leaf of its own (and split it).
        let (mut runs, mut holes_begun) = (0u64, 0usize);
        for (mut l, end) in holes {
            holes_begun += 1;
            while l < end {
                // The next run changes a bitmap and a descriptor block at most.
                if budget.is_some_and(|b| {
                    let tree = TREE_CREDITS + runs_credits(runs + 1, leaf) + 2 * holes_begun;
                    allocated > 0 && self.log_used(per) + 2 + tree > b
                }) {
                    return Ok((allocated, l));
                }
                runs += 1;
                let (p, len) = self.alloc_run(io, goal, end - l)?;
                goal = p + u64::from(len);
                map.insert_run(l, p, len, true);
                // Cached pages over the hole held reservations: the blocks exist now.
                self.data.lock().allocated_range(ino, l, l + len);
                l += len;
                allocated += u64::from(len);
            }
        }
        Ok((allocated, last))
    }

    // ----- extended attributes -----

    /// The xattr block of inode `ino`, if it has one, checked to lie in the data area and on
    /// no fixed metadata (it is rewritten and freed like any block the inode owns).
    fn xattr_block(&self, ino: u32, i: &Inode) -> Result<Option<u64>> {
        let blk = i.file_acl();
        if blk == 0 {
            return Ok(None);
        }
        self.layout
            .check_run(blk, 1)
            .map_err(|why| FsError::corrupt_inode(ino, format!("xattr block: {why}")))?;
        Ok(Some(blk))
    }

    pub(super) fn load_xattrs(&mut self, io: &Io, ino: u32, i: &Inode) -> Result<Vec<Xattr>> {
        let mut all = xattr::parse_inode_area(i.xattr_area())
            .map_err(|c| FsError::Corrupt(c.in_inode(ino)))?;
        if let Some(blk) = self.xattr_block(ino, i)? {
            let seed = self.geo.csum_seed;
            let b = self.block(io, blk)?;
            all.extend(xattr::parse_block(b, seed, blk).map_err(|c| c.in_inode(ino))?);
        }
        Ok(all)
    }

    /// Stores `attrs` as all the extended attributes of `ino` (the only writer of them), in
    /// the inode and its attribute block; the caller writes the inode.
    pub(super) fn store_xattrs(
        &mut self,
        io: &Io,
        ino: u32,
        i: &mut Inode,
        attrs: &[Xattr],
    ) -> Result<()> {
        // Every change of extended attributes comes here (setxattr, removexattr, capabilities
        // dropped by a write or chown, mode records) and is journaled in every mode, from here
        // to the operation's end: written in place, an attribute block (a new one, or a
        // shared one's copy and its reference count) and the inode naming it could part, a
        // "bad extended attribute block" that `fsck -p` will not mend (docs/DESIGN.md §3.1).
        // Its callers change nothing before this.
        self.act_strictly();
        self.names.withdraw_xattrs(ino);
        self.data.lock().writes_mut().withdraw_mode(ino);
        let (inside, outside) = split_xattrs(attrs, i.xattr_area().len());
        if !xattr::fits_in_block(&outside, self.geo.bs()) {
            return Err(FsError::NoSpace);
        }
        let old_blk = i.file_acl();
        if outside.is_empty() {
            if old_blk != 0 {
                self.release_xattr_block(io, old_blk)?;
                i.set_file_acl(0);
                i.set_blocks_512(
                    i.blocks_512(self.geo.block_size)
                        .saturating_sub(u64::from(self.geo.block_size / 512)),
                );
                self.blocks_changed.push(ino);
            }
        } else {
            let shared = old_blk != 0 && xattr::block_refcount(self.block(io, old_blk)?) > 1;
            let blk = if old_blk == 0 || shared {
                self.ensure_space(1)?;
                let goal = self
                    .geo
                    .group_first_block((ino - 1) / self.geo.inodes_per_group);
                let b = self.alloc_block(io, goal)?;
                self.new_block_mut(b);
                if shared {
                    self.release_xattr_block(io, old_blk)?;
                } else {
                    i.set_blocks_512(
                        i.blocks_512(self.geo.block_size) + u64::from(self.geo.block_size / 512),
                    );
                    self.blocks_changed.push(ino);
                }
                b
            } else {
                old_blk
            };
            let seed = self.geo.csum_seed;
            let b = self.block_mut(io, blk)?;
            xattr::write_block(b, &outside, seed, blk);
            i.set_file_acl(blk);
        }
        xattr::write_inode_area(i.xattr_area_mut(), &inside);
        Ok(())
    }

    /// The new attribute blocks storing `attrs` as all the extended attributes of inode `i`
    /// takes (`store_xattrs`): 1 when some go to a block and the inode has none, or shares
    /// its block with others (a copy); else 0. `NoSpace` when they fit neither the inode nor
    /// one block. For operations that check their space before their first change.
    pub(super) fn xattr_blocks_needed(
        &mut self,
        io: &Io,
        i: &Inode,
        attrs: &[Xattr],
    ) -> Result<u64> {
        let (_, outside) = split_xattrs(attrs, i.xattr_area().len());
        if !xattr::fits_in_block(&outside, self.geo.bs()) {
            return Err(FsError::NoSpace);
        }
        if outside.is_empty() {
            return Ok(0);
        }
        let old = i.file_acl();
        let shared = old != 0 && xattr::block_refcount(self.block(io, old)?) > 1;
        Ok(u64::from(old == 0 || shared))
    }

    pub(crate) fn getxattr(&mut self, io: &Io, ino: u32, name: &[u8]) -> Result<Vec<u8>> {
        let i = self.live_inode(io, ino)?;
        let (index, suffix) = xattr::split_name(name).ok_or(FsError::NotSupported)?;
        if mode_record::is_mode_attr(index, suffix) {
            // The mode the inode obeys, whether its own or inherited (see `fs/modes.rs`).
            let rec = self.mode_record(io, ino)?;
            if rec.kind == mode_record::RecordKind::Other {
                return Err(FsError::NoAttribute);
            }
            return Ok(rec.effective(self.default_mode).name().as_bytes().to_vec());
        }
        let attrs = self.published_xattrs(io, ino, &i)?;
        xattr_value(&attrs, index, suffix)
    }

    pub(crate) fn listxattr(&mut self, io: &Io, ino: u32) -> Result<Vec<Vec<u8>>> {
        let i = self.live_inode(io, ino)?;
        let attrs = self.published_xattrs(io, ino, &i)?;
        Ok(xattr_names(&attrs))
    }

    /// The extended attributes of `ino`, left in the name cache for reads without the lock.
    fn published_xattrs(&mut self, io: &Io, ino: u32, i: &Inode) -> Result<Vec<Xattr>> {
        let attrs = self.load_xattrs(io, ino, i)?;
        self.names.publish_xattrs(ino, &attrs);
        Ok(attrs)
    }

    pub(crate) fn setxattr(
        &mut self,
        io: &Io,
        ino: u32,
        name: &[u8],
        value: &[u8],
        how: XattrSetMode,
    ) -> Result<()> {
        let (index, suffix) = xattr::split_name(name).ok_or(FsError::NotSupported)?;
        if matches!(index, 2 | 3 | 7 | 8) {
            return Err(FsError::NotSupported);
        }
        if suffix.is_empty() || suffix.len() > 255 {
            return Err(if suffix.is_empty() {
                FsError::Invalid("empty xattr name")
            } else {
                FsError::Range
            });
        }
        if value.len() > self.geo.bs() - 64 {
            return Err(FsError::NoSpace);
        }
        if mode_record::is_linked_attr(index, suffix) {
            return Err(FsError::NotPermitted);
        }
        if mode_record::is_mode_attr(index, suffix) {
            let mode = mode_record::parse_user_mode(value)?;
            self.check_mode_attr(io, ino, Some(how))?;
            return self.set_journal_mode(io, ino, Some(mode)).map(|_| ());
        }
        let mut i = self.live_inode(io, ino)?;
        let mut attrs = self.load_xattrs(io, ino, &i)?;
        let pos = attrs
            .iter()
            .position(|a| a.index == index && a.name == suffix);
        match (pos, how) {
            (Some(_), XattrSetMode::Create) => return Err(FsError::Exists),
            (None, XattrSetMode::Replace) => return Err(FsError::NoAttribute),
            (Some(p), _) => attrs[p].value = value.to_vec(),
            (None, _) => attrs.push(Xattr {
                index,
                name: suffix.to_vec(),
                value: value.to_vec(),
            }),
        }
        self.store_xattrs(io, ino, &mut i, &attrs)?;
        i.set_ctime(now());
        self.write_inode(io, ino, &mut i)
    }

    pub(crate) fn removexattr(&mut self, io: &Io, ino: u32, name: &[u8]) -> Result<()> {
        let (index, suffix) = xattr::split_name(name).ok_or(FsError::NotSupported)?;
        if mode_record::is_linked_attr(index, suffix) {
            return Err(FsError::NotPermitted);
        }
        if mode_record::is_mode_attr(index, suffix) {
            self.check_mode_attr(io, ino, None)?;
            return self.set_journal_mode(io, ino, None).map(|_| ());
        }
        let mut i = self.live_inode(io, ino)?;
        let mut attrs = self.load_xattrs(io, ino, &i)?;
        let pos = attrs
            .iter()
            .position(|a| a.index == index && a.name == suffix)
            .ok_or(FsError::NoAttribute)?;
        attrs.remove(pos);
        self.store_xattrs(io, ino, &mut i, &attrs)?;
        i.set_ctime(now());
        self.write_inode(io, ino, &mut i)
    }
}

/// `attrs` as `Meta::store_xattrs` places them, greedily: as many as fit in an inode area of
/// `area_len` bytes, in order, then the rest (for one attribute block).
fn split_xattrs(attrs: &[Xattr], area_len: usize) -> (Vec<Xattr>, Vec<Xattr>) {
    let mut inside = Vec::new();
    let mut outside = Vec::new();
    for a in attrs {
        let mut trial = inside.clone();
        trial.push(a.clone());
        if outside.is_empty() && xattr::fits_in_inode(&trial, area_len) {
            inside = trial;
        } else {
            outside.push(a.clone());
        }
    }
    (inside, outside)
}

/// The value of stored attribute `index`/`suffix` among `attrs`, as `getxattr` answers it
/// (the journaling-mode attribute, not stored as such, is answered by the caller).
pub(super) fn xattr_value(attrs: &[Xattr], index: u8, suffix: &[u8]) -> Result<Vec<u8>> {
    if mode_record::is_linked_attr(index, suffix) {
        return Err(FsError::NoAttribute);
    }
    attrs
        .iter()
        .find(|a| a.index == index && a.name == suffix)
        .map(|a| a.value.clone())
        .ok_or(FsError::NoAttribute)
}

/// The names `listxattr` shows of `attrs`.
pub(super) fn xattr_names(attrs: &[Xattr]) -> Vec<Vec<u8>> {
    attrs
        .iter()
        .filter(|a| !mode_record::is_linked_attr(a.index, &a.name))
        .map(|a| xattr::full_name(a.index, &a.name))
        .collect()
}
