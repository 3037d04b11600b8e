/*
 * A loader's use of packaging/tensorfs_extents.h: locates TENSOR in FILE (a .safetensors file
 * of a TensorFS mount), prints what the daemon says, then reads every extent from its blob and
 * checks it against the bytes the mount shows at the extent's file offset.
 *
 * Usage: extents_client FILE TENSOR
 * Exit: 0 all extents match, 1 a mismatch or I/O error, 2 an ioctl failed (errno on stderr).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "tensorfs_extents.h"

/* The offsets docs/extents.md gives. */
_Static_assert(offsetof(struct tensorfs_query, name) == 16, "query.name");
_Static_assert(offsetof(struct tensorfs_tensor, key) == 1040, "tensor.key");
_Static_assert(offsetof(struct tensorfs_tensor, shape) == 2088, "tensor.shape");
_Static_assert(offsetof(struct tensorfs_tensor, n_extents) == 2152, "tensor.n_extents");
_Static_assert(offsetof(struct tensorfs_tensor, flags) == 2176, "tensor.flags");
_Static_assert(offsetof(struct tensorfs_tensor, scheme) == 2184, "tensor.scheme");
_Static_assert(offsetof(struct tensorfs_tensor, store) == 2248, "tensor.store");
_Static_assert(offsetof(struct tensorfs_tensor, params) == 6344, "tensor.params");
_Static_assert(offsetof(struct tensorfs_part, shape) == 1128, "part.shape");
_Static_assert(offsetof(struct tensorfs_part, n_extents) == 1216, "part.n_extents");
_Static_assert(offsetof(struct tensorfs_extents, extents) == 1056, "extents.extents");
_Static_assert(offsetof(struct tensorfs_extent, blob_length) == 72, "extent.blob_length");
_Static_assert(offsetof(struct tensorfs_extent, file_offset) == 96, "extent.file_offset");

static void query(struct tensorfs_query *q, const char *name, uint32_t index)
{
	q->abi_version = TENSORFS_EXTENTS_ABI;
	q->index = index;
	q->reserved = 0;
	strcpy(q->name, name); /* length checked in main */
}

static int call(int fd, unsigned long cmd, void *arg, const char *what)
{
	if (ioctl(fd, cmd, arg) == 0)
		return 0;
	fprintf(stderr, "%s: %s\n", what, strerror(errno));
	return -1;
}

static int read_all(int fd, char *buf, uint64_t length, uint64_t offset)
{
	uint64_t done = 0;
	while (done < length) {
		ssize_t n = pread(fd, buf + done, length - done, (off_t)(offset + done));
		if (n <= 0)
			return -1;
		done += (uint64_t)n;
	}
	return 0;
}

int main(int argc, char **argv)
{
	static struct tensorfs_tensor t;
	static struct tensorfs_part p;
	static struct tensorfs_extents e;

	if (argc != 3 || strlen(argv[2]) >= TENSORFS_NAME_BYTES) {
		fprintf(stderr, "usage: %s FILE TENSOR\n", argv[0]);
		return 2;
	}
	printf("commands %#lx %#lx %#lx\n", (unsigned long)TENSORFS_IOC_TENSOR,
	       (unsigned long)TENSORFS_IOC_PART, (unsigned long)TENSORFS_IOC_EXTENTS);
	int fd = open(argv[1], O_RDONLY);
	if (fd < 0) {
		perror(argv[1]);
		return 1;
	}
	query(&t.query, argv[2], 0);
	if (call(fd, TENSORFS_IOC_TENSOR, &t, "TENSORFS_IOC_TENSOR"))
		return 2;
	printf("key %s\ndtype %s\nshape", t.key, t.dtype);
	for (uint32_t i = 0; i < t.rank; i++)
		printf(" %llu", (unsigned long long)t.shape[i]);
	printf("\nscheme %s\nparts %u\nextents %llu\n", (t.flags & TENSORFS_FLAG_ENCODED) ? t.scheme : "plain",
	       t.n_parts, (unsigned long long)t.n_extents);
	for (uint32_t i = 0; i < t.n_parts; i++) {
		memset(&p, 0, sizeof p);
		query(&p.query, argv[2], i);
		if (call(fd, TENSORFS_IOC_PART, &p, "TENSORFS_IOC_PART"))
			return 2;
		printf("part %u %s %s file %llu..%llu extents %llu+%llu\n", i, p.role, p.dtype,
		       (unsigned long long)p.file_begin, (unsigned long long)p.file_end,
		       (unsigned long long)p.first_extent, (unsigned long long)p.n_extents);
	}

	uint64_t seen = 0;
	uint32_t pages = 0;
	while (seen < t.n_extents) {
		memset(&e, 0, sizeof e);
		query(&e.query, argv[2], pages);
		if (call(fd, TENSORFS_IOC_EXTENTS, &e, "TENSORFS_IOC_EXTENTS"))
			return 2;
		if (e.count == 0) {
			fprintf(stderr, "page %u is empty after %llu of %llu extents\n", pages,
				(unsigned long long)seen, (unsigned long long)e.total);
			return 1;
		}
		for (uint32_t i = 0; i < e.count; i++) {
			const struct tensorfs_extent *x = &e.extents[i];
			char path[TENSORFS_STORE_BYTES + 100];
			snprintf(path, sizeof path, "%s/blobs/%.2s/%.2s/%.64s", t.store, x->blob,
				 x->blob + 2, x->blob);
			char *direct = malloc(x->length), *mounted = malloc(x->length);
			int blob = open(path, O_RDONLY);
			if (!direct || !mounted || blob < 0 ||
			    read_all(blob, direct, x->length, x->offset) ||
			    read_all(fd, mounted, x->length, x->file_offset)) {
				fprintf(stderr, "reading extent %llu (%s): %s\n",
					(unsigned long long)seen, path, strerror(errno));
				return 1;
			}
			if (memcmp(direct, mounted, x->length) != 0) {
				fprintf(stderr, "extent %llu differs from the file at %llu\n",
					(unsigned long long)seen, (unsigned long long)x->file_offset);
				return 1;
			}
			close(blob);
			free(direct);
			free(mounted);
			seen++;
		}
		pages++;
	}
	printf("pages %u\nok\n", pages);
	close(fd);
	return 0;
}
