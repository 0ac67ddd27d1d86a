"""The page's CSS and head script, kept free of imports so that `apps.demo` can pass them to
`launch` cheaply.

Widths from 360 px to 1920 px: the container uses the window (`fill_width`), the two columns wrap
under each other below about 620 px, and the per-head gallery keeps its images at every width.
"""

GALLERY_COLUMNS = 6  # the CSS below fits as many 96-px tiles per row as the width allows

CSS = """
/* Small inputs (a 28 x 28 upload) fill their box, upscaled pixel for pixel (nearest neighbour). */
.pixel-image img { width: 100%; height: 100%; object-fit: contain; image-rendering: pixelated; }
/* Labels sit above the images, not on top of them. */
.pixel-image [data-testid="block-label"], #heads [data-testid="block-label"] { position: static; margin-bottom: 4px; }
/* The gallery is as tall as its rows (no blank space under it), captions under the images. */
#heads .grid-wrap { height: auto !important; min-height: 0 !important; max-height: none !important; overflow: visible; }
#heads .grid-container { padding-top: 0; grid-template-columns: repeat(auto-fit, minmax(96px, 1fr)) !important; }
#heads .thumbnail-item { height: auto; display: flex; flex-direction: column; }
#heads .thumbnail-item img { width: 100%; height: auto; aspect-ratio: 1; image-rendering: pixelated; }
#heads .caption-label { position: static; transform: none; max-width: 100%; margin: 2px auto; }
table.facts { width: 100%; border-collapse: collapse; font-size: 0.9em; }
table.facts caption { text-align: left; font-weight: 600; font-size: 1.1em; padding-bottom: 4px; }
table.facts th { text-align: left; font-weight: 600; padding: 2px 12px 2px 0; white-space: nowrap; }
table.facts td { padding: 2px 0; }
"""

# Gradio's gallery marks its images loading="lazy"; far down a narrow page (one column) Chromium
# then leaves them unloaded, and the gallery shows captions without images. They are small, so
# load them at once.
HEAD = """<script>
new MutationObserver(() => {
  document.querySelectorAll('#heads img[loading="lazy"]').forEach((img) => { img.loading = "eager"; });
}).observe(document.documentElement, {subtree: true, childList: true});
</script>"""
