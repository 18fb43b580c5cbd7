"""The Block tables page's grid, from the block-grid endpoint's columns (`GET
/engines/{id}/blocks/grid`) to what its figure draws: each block's category (`categories`), a
row per block (`blocks`), the cells drawn, one a block or one a run of blocks (`cells`), the
copies and moves as arrows between cells (`arrows`), and a request's blocks and hit boundary
(`outline`). Pure functions of the REST body; the figure is `dashboard.figures.block_grid`."""
