/* path.h - file-name helpers shared by every reader. */
#ifndef DRAMA_BASE_PATH_H
#define DRAMA_BASE_PATH_H

#include <stddef.h>

/* Git checkouts made without symlink support (core.symlinks=false) store a symbolic link as a
 * small regular file whose whole content is the link target. Model folders copied that way
 * (hub caches, the golden variants) would otherwise fail to load. If `path` is such a
 * placeholder - under 1 KiB, one relative path line, whose target has the same base name and
 * is an existing regular file - write the target (relative to path's folder, followed up to 8
 * levels) into buf and return buf; otherwise return path unchanged. Never follows absolute
 * targets, so a placeholder cannot point outside a relative tree the way an absolute one could. */
const char *dr_path_follow_placeholder(const char *path, char *buf, size_t buflen);

#endif
