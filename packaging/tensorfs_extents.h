/*
 * tensorfs_extents.h: the TensorFS extents ioctl, ABI versions 1 and 2.
 *
 * On an open .safetensors file of a TensorFS mount, these ioctls tell where a tensor's bytes
 * lie in the store: its logical dtype and shape, its encoding, and for each stored part the
 * byte ranges ("extents") of chunk blobs that hold it, in file order. A loader may then read
 * the blobs directly: <store>/blobs/<hex[0:2]>/<hex[2:4]>/<hex>.
 *
 * ABI 2 (TENSORFS_IOC_FILE) describes every tensor of the file at once, as JSON read in pages;
 * on a lazy mount it fetches the file's chunks first and keeps them while the file is open.
 *
 * Every command is _IOWR(TENSORFS_IOC_MAGIC, nr, struct): fill the struct's query (zero
 * everything else), call ioctl(fd, TENSORFS_IOC_..., &s); on 0 the daemon has filled in the
 * answer. Integers are little-endian; strings are UTF-8, NUL-padded. Layout and errors:
 * docs/extents.md. Linux on x86-64, AArch64 or RISC-V (asm-generic ioctl numbers).
 *
 * Errors (errno when ioctl returns -1):
 *   ENOTTY      not a TensorFS file, or a daemon without these commands
 *   EOPNOTSUPP  the file is not a .safetensors file of a lane (a config, an asset, a folder)
 *   ENOENT      no tensor of that name in the file
 *   ENODATA     the tensor is decoded in this view (<lane>@decoded), or a single file's array
 *               made when read (transposed): no stored bytes hold it as the file shows it
 *   EINVAL      malformed query (reserved field not 0, name empty or without NUL, part index
 *               past the last part)
 *   EPROTO      abi_version is not one the daemon speaks
 *   EOVERFLOW   the answer does not fit a field (rank over 8, a long dtype, role or scheme)
 *   EIO         the commit cannot be read
 */
#ifndef TENSORFS_EXTENTS_H
#define TENSORFS_EXTENTS_H

#include <stdint.h>
#include <linux/ioctl.h>

#define TENSORFS_EXTENTS_ABI 1u   /* put in query.abi_version */
#define TENSORFS_IOC_MAGIC 0xE7

#define TENSORFS_NAME_BYTES 1024  /* name fields, NUL included */
#define TENSORFS_MAX_RANK 8
#define TENSORFS_DTYPE_BYTES 16
#define TENSORFS_SCHEME_BYTES 64
#define TENSORFS_ROLE_BYTES 64
#define TENSORFS_STORE_BYTES 4096
#define TENSORFS_PARAMS_PAGE_BYTES 4096
#define TENSORFS_EXTENTS_PER_PAGE 128

#define TENSORFS_FLAG_ENCODED 1u  /* tensorfs_tensor.flags: the tensor is encoded */

/* The head of every command's struct: what the caller asks. */
struct tensorfs_query {
	uint32_t abi_version;               /* in: TENSORFS_EXTENTS_ABI; out: the same */
	uint32_t index;                     /* in: params page (TENSOR), part (PART), extents page (EXTENTS) */
	uint64_t reserved;                  /* in: 0 */
	char name[TENSORFS_NAME_BYTES];     /* in: the tensor's name in the file, NUL-terminated;
	                                       an encoded tensor's key or one of its parts' names */
};

/* TENSORFS_IOC_TENSOR: the tensor. */
struct tensorfs_tensor {
	struct tensorfs_query query;
	char key[TENSORFS_NAME_BYTES];      /* the tensor's key (differs from name when name is a part's) */
	char dtype[TENSORFS_DTYPE_BYTES];   /* logical dtype, safetensors name: "BF16" */
	uint32_t rank;                      /* entries of shape used */
	uint32_t n_parts;                   /* 1 for a plain tensor (role "weight") */
	uint64_t shape[TENSORFS_MAX_RANK];  /* logical shape, outermost first */
	uint64_t n_extents;                 /* extents of all parts together */
	uint64_t file_begin;                /* plain tensor: its bytes in this file (absolute */
	uint64_t file_end;                  /*   offsets, end exclusive); encoded: 0, see parts */
	uint32_t flags;                     /* TENSORFS_FLAG_ENCODED */
	uint32_t params_len;                /* bytes of the params JSON (0 when plain) */
	char scheme[TENSORFS_SCHEME_BYTES]; /* encoding scheme ("nvfp4"), "" when plain */
	char store[TENSORFS_STORE_BYTES];   /* the store's root folder */
	char params[TENSORFS_PARAMS_PAGE_BYTES]; /* params JSON bytes [index*4096, index*4096+4096),
	                                            zero-padded, not NUL-terminated when full */
};

/* TENSORFS_IOC_PART: part query.index of the tensor. */
struct tensorfs_part {
	struct tensorfs_query query;
	char role[TENSORFS_ROLE_BYTES];     /* "weight", "scale", ... */
	char dtype[TENSORFS_DTYPE_BYTES];   /* stored dtype */
	uint32_t rank;
	uint32_t reserved;
	uint64_t shape[TENSORFS_MAX_RANK];  /* stored shape */
	uint64_t file_begin;                /* the part's bytes in this file (absolute offsets) */
	uint64_t file_end;
	uint64_t first_extent;              /* its extents: [first_extent, first_extent + n_extents) */
	uint64_t n_extents;
};

/* One byte range of a chunk blob. */
struct tensorfs_extent {
	uint32_t part;                      /* index of the part it belongs to */
	uint32_t reserved;
	char blob[64];                      /* the blob's sha256, lowercase hex, no NUL */
	uint64_t blob_length;               /* the blob's size in bytes */
	uint64_t offset;                    /* in the blob */
	uint64_t length;                    /* bytes, never 0 */
	uint64_t file_offset;               /* where these bytes are in this file */
};

/* TENSORFS_IOC_EXTENTS: extents [index*128, index*128 + count) of the tensor. */
struct tensorfs_extents {
	struct tensorfs_query query;
	uint64_t total;                     /* extents of the tensor */
	uint32_t count;                     /* extents in this page (0 past the last page) */
	uint32_t reserved;
	struct tensorfs_extent extents[TENSORFS_EXTENTS_PER_PAGE];
};

#define TENSORFS_FILE_ABI 2u        /* put in tensorfs_file.abi_version */
#define TENSORFS_FILE_PAGE_BYTES 16320

/* TENSORFS_IOC_FILE (ABI 2): page `page` of the file's description, a JSON object
   (docs/extents.md: store, blobs with their stamps, tensors with parts and extents). */
struct tensorfs_file {
	uint32_t abi_version;               /* in: TENSORFS_FILE_ABI */
	uint32_t page;                      /* in: 0, 1, ... */
	uint64_t reserved;                  /* in: 0 */
	uint64_t total;                     /* in: 0; out: bytes of the whole description */
	uint32_t count;                     /* in: 0; out: bytes in this page */
	uint32_t reserved2;                 /* 0 */
	uint8_t bytes[TENSORFS_FILE_PAGE_BYTES]; /* out: bytes [page*16320, page*16320 + count) */
};

#define TENSORFS_IOC_TENSOR _IOWR(TENSORFS_IOC_MAGIC, 1, struct tensorfs_tensor)
#define TENSORFS_IOC_PART _IOWR(TENSORFS_IOC_MAGIC, 2, struct tensorfs_part)
#define TENSORFS_IOC_EXTENTS _IOWR(TENSORFS_IOC_MAGIC, 3, struct tensorfs_extents)
#define TENSORFS_IOC_FILE _IOWR(TENSORFS_IOC_MAGIC, 4, struct tensorfs_file)

#ifdef __cplusplus
#define TENSORFS_STATIC_ASSERT static_assert
#else
#define TENSORFS_STATIC_ASSERT _Static_assert
#endif
TENSORFS_STATIC_ASSERT(sizeof(struct tensorfs_query) == 1040, "tensorfs_query layout");
TENSORFS_STATIC_ASSERT(sizeof(struct tensorfs_tensor) == 10440, "tensorfs_tensor layout");
TENSORFS_STATIC_ASSERT(sizeof(struct tensorfs_part) == 1224, "tensorfs_part layout");
TENSORFS_STATIC_ASSERT(sizeof(struct tensorfs_extent) == 104, "tensorfs_extent layout");
TENSORFS_STATIC_ASSERT(sizeof(struct tensorfs_extents) == 14368, "tensorfs_extents layout");
TENSORFS_STATIC_ASSERT(sizeof(struct tensorfs_file) == 16352, "tensorfs_file layout");
#undef TENSORFS_STATIC_ASSERT

#endif /* TENSORFS_EXTENTS_H */
