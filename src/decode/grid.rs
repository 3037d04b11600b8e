//! Scale grids (spec §6 "Building blocks"): which element of a part gives element `(i, j)` of
//! the `[R, C]` view its scale, zero or bias.

use super::View;

/// How row blocks are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// The logical shape with its last extent replaced by `W`; `s(i, b)` is element `i·W + b`.
    RowMajor,
    /// `[W, R]`; `s(i, b)` is element `b·R + i` (GPTQ's and AWQ's `[K/g, N]`).
    Transposed,
    /// cuBLAS's block-scaling layout as ComfyUI stores it: each matrix `[N, C]` tiled on its own
    /// into `[…stack, 128·⌈N/128⌉, 4·⌈W/4⌉]`, zero-padded, in tiles of 128 rows × 4 blocks.
    Cublas128x4,
}

impl Layout {
    /// The layout a `scale_layout` param names.
    pub const NAMES: [&'static str; 2] = ["row_major", "cublas_128x4"];
}

/// Where element `(i, j)`'s value is in a part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grid {
    /// One element, any shape: `s[0]`.
    Tensor,
    /// `R` elements, any shape: `s[i]`.
    Row,
    /// `C` elements, any shape: `s[j]`.
    Column,
    /// `W = ⌈C/B⌉` blocks of `B` columns per row, stored `layout`; `n` is the rows of one matrix
    /// (the logical shape's second-last extent, or `R` at rank ≤ 2), which `Cublas128x4` tiles.
    RowBlocks {
        /// Columns per block, `B`.
        block: u64,
        /// Blocks per row, `W`.
        width: u64,
        /// How they are stored.
        layout: Layout,
        /// Rows of one matrix.
        n: u64,
        /// Rows of the view, `R`.
        rows: u64,
    },
    /// Tiles of `br × bc` of each matrix `[n, C]`: `[lead…, ⌈n/br⌉, ⌈C/bc⌉]`.
    Tiles {
        /// Tile rows.
        br: u64,
        /// Tile columns.
        bc: u64,
        /// Rows of one matrix.
        n: u64,
        /// Columns of the view.
        cols: u64,
    },
}

impl Grid {
    /// Row blocks of `block` columns over `view`, stored `layout`, for a logical `shape`.
    pub fn row_blocks(view: View, shape: &[u64], block: u64, layout: Layout) -> Grid {
        Grid::RowBlocks {
            block,
            width: view.cols.div_ceil(block),
            layout,
            n: matrix_rows(view, shape),
            rows: view.rows,
        }
    }

    /// Tiles of `br × bc` over `view` of a logical `shape`.
    pub fn tiles(view: View, shape: &[u64], br: u64, bc: u64) -> Grid {
        Grid::Tiles {
            br,
            bc,
            n: matrix_rows(view, shape),
            cols: view.cols,
        }
    }

    /// The element holding `(i, j)`'s value.
    #[inline]
    pub fn index(&self, i: u64, j: u64) -> u64 {
        match *self {
            Grid::Tensor => 0,
            Grid::Row => i,
            Grid::Column => j,
            Grid::RowBlocks { block, .. } => self.block_index(i, j / block),
            Grid::Tiles { br, bc, n, cols } => {
                let (m, r) = (i / n, i % n);
                let (tiles_r, tiles_c) = (n.div_ceil(br), cols.div_ceil(bc));
                (m * tiles_r + r / br) * tiles_c + j / bc
            }
        }
    }

    /// The element holding block `b` of row `i` (row blocks only; a `g_idx` gives `b`).
    #[inline]
    pub fn block_index(&self, i: u64, b: u64) -> u64 {
        let Grid::RowBlocks {
            width,
            layout,
            n,
            rows,
            ..
        } = *self
        else {
            unreachable!("block_index on row blocks only")
        };
        match layout {
            Layout::RowMajor => i * width + b,
            Layout::Transposed => b * rows + i,
            Layout::Cublas128x4 => {
                let (m, r) = (i / n, i % n);
                let padded_rows = 128 * n.div_ceil(128);
                let padded_width = 4 * width.div_ceil(4);
                m * padded_rows * padded_width
                    + 512 * ((r / 128) * padded_width.div_ceil(4) + b / 4)
                    + 16 * (r % 32)
                    + 4 * ((r % 128) / 32)
                    + b % 4
            }
        }
    }

    /// The stored shape this grid expects for a part over `view` of logical `shape`, where a
    /// grid fixes one (`None`: any shape with [`Grid::elements`] elements).
    pub fn stored_shape(&self, view: View, shape: &[u64]) -> Option<Vec<u64>> {
        match *self {
            Grid::Tensor | Grid::Row | Grid::Column => None,
            Grid::RowBlocks {
                width, layout, n, ..
            } => Some(match layout {
                Layout::RowMajor => {
                    let mut s = shape.to_vec();
                    match s.last_mut() {
                        Some(last) => *last = width,
                        None => s.push(width),
                    }
                    s
                }
                Layout::Transposed => vec![width, view.rows],
                Layout::Cublas128x4 => {
                    let mut s: Vec<u64> = shape[..shape.len().saturating_sub(2)].to_vec();
                    s.push(128 * n.div_ceil(128));
                    s.push(4 * width.div_ceil(4));
                    s
                }
            }),
            Grid::Tiles { br, bc, n, cols } => {
                let mut s: Vec<u64> = shape[..shape.len().saturating_sub(2)].to_vec();
                s.push(n.div_ceil(br));
                s.push(cols.div_ceil(bc));
                Some(s)
            }
        }
    }

    /// Elements a part on this grid holds over `view` of logical `shape`.
    pub fn elements(&self, view: View, shape: &[u64]) -> u64 {
        match self {
            Grid::Tensor => 1,
            Grid::Row => view.rows,
            Grid::Column => view.cols,
            _ => self
                .stored_shape(view, shape)
                .expect("blocked grids fix a shape")
                .iter()
                .product(),
        }
    }
}

/// Rows of one matrix of a logical shape: its second-last extent, or all rows at rank ≤ 2.
fn matrix_rows(view: View, shape: &[u64]) -> u64 {
    match shape.len() {
        0..=2 => view.rows,
        n => shape[n - 2],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_major_blocks_index_by_row_then_block() {
        let view = View { rows: 3, cols: 70 };
        let g = Grid::row_blocks(view, &[3, 70], 32, Layout::RowMajor);
        assert_eq!(g.index(0, 0), 0);
        assert_eq!(g.index(0, 69), 2);
        assert_eq!(g.index(2, 33), 2 * 3 + 1);
        assert_eq!(g.stored_shape(view, &[3, 70]), Some(vec![3, 3]));
    }

    #[test]
    fn transposed_blocks_index_by_block_then_row() {
        let view = View { rows: 5, cols: 64 };
        let g = Grid::row_blocks(view, &[5, 64], 16, Layout::Transposed);
        assert_eq!(g.index(1, 16), 5 + 1);
        assert_eq!(g.stored_shape(view, &[5, 64]), Some(vec![4, 5]));
    }

    #[test]
    fn cublas_tiles_follow_the_spec_formula() {
        let view = View {
            rows: 256,
            cols: 160,
        };
        let g = Grid::row_blocks(view, &[256, 160], 16, Layout::Cublas128x4);
        // W = 10, padded to 12: row r, block b.
        let expect = |r: u64, b: u64| {
            512 * ((r / 128) * 3 + b / 4) + 16 * (r % 32) + 4 * ((r % 128) / 32) + b % 4
        };
        for (r, b) in [(0, 0), (1, 0), (33, 5), (127, 9), (128, 0), (255, 9)] {
            assert_eq!(g.block_index(r, b), expect(r, b), "row {r} block {b}");
        }
        assert_eq!(g.stored_shape(view, &[256, 160]), Some(vec![256, 12]));
    }

    #[test]
    fn a_stack_tiles_each_matrix_on_its_own() {
        let shape = [2, 100, 64];
        let view = View::of(&shape).unwrap();
        let g = Grid::row_blocks(view, &shape, 16, Layout::Cublas128x4);
        assert_eq!(g.stored_shape(view, &shape), Some(vec![2, 128, 4]));
        assert_eq!(g.block_index(100, 0), 128 * 4);
    }

    #[test]
    fn tiles_count_each_matrix_in_tiles() {
        let shape = [2, 300, 260];
        let view = View::of(&shape).unwrap();
        let g = Grid::tiles(view, &shape, 128, 128);
        assert_eq!(g.stored_shape(view, &shape), Some(vec![2, 3, 3]));
        assert_eq!(g.index(300 + 129, 259), (3 + 1) * 3 + 2);
    }
}
