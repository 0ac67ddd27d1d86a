"""The page's events and the /predict API. Each user action sends one request, which returns the
whole result: an upload (or paste, or clear) fires the image's `input` event once, an example click
its own load event once, a class click the label's `select`, an overlay click the overlay's
`select`, and a control its `input` or `release` event. Events that only the page sets (`change`)
are not used, so that an update from a response never sends another request.

The page's events are private; the API is one endpoint, /predict, bound to a hidden button. The
page answers a refused upload with one warning toast and cleared panes; the API raises, so
`gradio_client` gets the same message as an exception. Neither logs a traceback for input refused
on purpose. Layers, heads, patches count from 1, as in the paper.
"""

import sys
import time

import gradio as gr

from keras_vit.io.images import ImageRejected
from apps.page import API_DESCRIPTION, CLEAR_WITH_IMAGE, caption_html, model_facts, publish, warning_html
from apps.images import gradient_css, patch_at
from apps.inference import PATCH, RELEVANCE, VIEWS, Settings

CONCURRENCY_ID = "model"  # every event shares the queue's concurrency limit
GRADIENT = gradient_css()  # the overlays' colour map, for the caption's legend
# The page's values that every event reads, by the name of their `apps.ui.Page` field. The events
# take them as one {component: value} dict (Gradio passes a set of inputs so) and return one too.
CONTROLS = ("image", "view", "class_name", "patch", "layer", "head", "opacity", "fashion")


def bind(predictor, page, title):
    """Binds the page's events and the /predict API of `page` (an `apps.ui.Page`)."""
    show = _Show(predictor, page, title)
    p = page
    common = dict(inputs={getattr(p, name) for name in CONTROLS}, outputs=show.outputs, show_progress_on=[p.overlay],
                  api_visibility="private", trigger_mode="always_last", concurrency_id=CONCURRENCY_ID)

    def new_image(values):
        return show(values, class_name=None)  # the top class

    def class_chosen(values, evt: gr.SelectData):
        return show(values, view=RELEVANCE, class_name=evt.value)

    def class_clicked(values, evt: gr.SelectData):
        return show(values, view=RELEVANCE, class_name=evt.value)

    def patch_clicked(values, evt: gr.SelectData):
        image, fashion = values[p.image], values[p.fashion]
        row, column = patch_at(evt.index, *predictor.overlay_grid(image, fashion))  # from 0
        return show(values, view=PATCH, patch=(row + 1, column + 1))

    gr.on([p.image.input, p.fashion.input], new_image, **common)
    if p.examples is not None:  # the click loads the example without a queued request; then one request
        p.examples.load_input_event.success(new_image, **common)
    p.top.select(class_clicked, **common)
    # `select`, not `input`: a pick with the mouse sends `input` twice (Gradio 6.31), `select` once.
    p.class_name.select(class_chosen, **common)
    p.overlay.select(patch_clicked, **common)
    gr.on([p.view.input, p.head.select, p.layer.release, p.opacity.release], show, **common)
    # A file over the size limit is refused by the browser, which empties the image without an
    # `input` event; the result panes are emptied with it, in the browser, without a request.
    outputs = [p.top, p.overlay, p.caption, p.per_head, p.unlike]
    p.image.change(None, [p.image, *outputs], outputs, js=CLEAR_WITH_IMAGE, api_visibility="private")
    api = page.api
    gr.Button(visible=False).click(
        show.api,
        [page.image, api["view"], api["class_name"], api["patch_row"], api["patch_column"], api["layer"],
         api["head"], api["opacity"], page.fashion],
        show.api_outputs,
        api_name="predict",
        api_description=API_DESCRIPTION,
        concurrency_id=CONCURRENCY_ID,
    )


class _Show:
    """The function behind every event: the page's settings in, the whole result out."""

    def __init__(self, predictor, page, title):
        self.predictor, self.page, self.title = predictor, page, title
        self.model = predictor.model
        self.cache_dir = page.overlay.GRADIO_CACHE
        p = page
        # What the API returns, in this order for its clients; the page's events return these and
        # the controls (the order of the page's list does not matter: events return dicts).
        self.api_outputs = [p.top, p.overlay, p.caption, p.per_head, p.facts, p.unlike]
        self.outputs = [*self.api_outputs, p.view, p.class_name, p.layer, p.head, p.opacity, p.controls_note, p.patch,
                        p.image]

    def __call__(self, values, **changed):
        """The page: `values` is the {component: value} dict of the `CONTROLS`, and `changed` sets
        some of them by name. A non-number in a slider's box (`ClampedSlider` gives None) keeps the
        default, and a refused upload is a warning toast."""
        components = {name: getattr(self.page, name) for name in CONTROLS}
        v = {name: values[component] for name, component in components.items()} | changed
        sent = {component: values[component] for name, component in components.items() if name not in changed}
        layer, opacity = self.page.layer.clamp(v["layer"]), self.page.opacity.clamp(v["opacity"])
        opacity = 0.5 if opacity is None else opacity
        head = v["head"] if v["head"] == "mean" else int(v["head"])
        settings = self.predictor.check(Settings(v["view"], self._class_index(v["class_name"]), v["patch"], layer,
                                                 head, opacity, bool(v["fashion"])))
        if v["image"] is None:
            return self._page_outputs(settings, sent)
        try:
            result, shown = self._run(v["image"], settings)
        except ImageRejected as e:
            self._log_refusal(e)
            # A warning toast, not gr.Error: an error would also put an "Error" badge on every
            # output pane, for an input refused on purpose. Gradio 6.31 heads a toast with its
            # kind ("Warning") whatever the title, so the message names the app as well.
            gr.Warning(f"{self.title}: image refused. {e}", title=f"{self.title}: image refused")
            return self._page_outputs(settings, sent, refused=True)
        return self._page_outputs(shown, sent, result)

    def api(self, image, view, class_name, patch_row, patch_column, layer, head, opacity, fashion_style):
        """Classifies an image and explains it; layers, heads and patches count from 1.

        A refused image or a value out of range raises, so that clients get the message."""
        try:
            if image is None:
                raise ValueError("no image was sent; send one with gradio_client.handle_file(path)")
            settings = self.predictor.check(self._api_settings(view, class_name, patch_row, patch_column, layer,
                                                               head, opacity, fashion_style))
            result, _ = self._run(image, settings)
        except ImageRejected as e:
            self._log_refusal(e)
            raise gr.Error(f"{self.title}: image refused. {e}", title=f"{self.title}: image refused",
                           print_exception=False) from None
        except ValueError as e:
            self._log_refusal(e, "a value")
            raise gr.Error(str(e), title=f"{self.title}: bad value", print_exception=False) from None
        return tuple(result[c] for c in self.api_outputs)  # a client reads the API's outputs by position

    def _api_settings(self, view, class_name, patch_row, patch_column, layer, head, opacity, fashion_style):
        """The API's values as `Settings`, their types checked here (the API's JSON can carry a
        string, a number or a list anywhere, and every input passes it on as sent) and their ranges
        by `Predictor.check`, as the page's are."""
        numbers = (("layer", layer), ("patch_row", patch_row), ("patch_column", patch_column), ("opacity", opacity))
        for name, value in numbers:
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ValueError(f"{name}={value!r} is not a number; give {name} as a JSON number")
        for name, value in numbers[:3]:
            if value is not None and float(value) != int(value):
                raise ValueError(f"{name}={value} is not an integer")
        for name, value in (("view", view), ("class_name", class_name), ("head", head)):
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{name}={value!r} is not a string; give {name} as a JSON string")
        if not (head == "mean" or str(head).isdigit()):
            raise ValueError(f"head={head!r}; use 'mean' or '1' to '{self.model.num_heads}'")
        if not isinstance(fashion_style, bool):  # bool("false") is True: only JSON true or false is taken
            raise ValueError(f"fashion_style={fashion_style!r} is not a boolean; give fashion_style as JSON true "
                             "or false")
        # 0, 0: the center patch
        patch = None if (patch_row, patch_column) == (0, 0) else (int(patch_row or 0), int(patch_column or 0))
        return Settings(view, self._class_index(class_name or None), patch, None if layer is None else int(layer),
                        "mean" if head == "mean" else int(head), 0.5 if opacity is None else float(opacity),
                        fashion_style)

    def _class_index(self, name):
        """The index of class `name` (None: the top class); a ValueError for an unknown name."""
        if name is None:
            return None
        if name not in self.predictor.labels:
            labels = self.predictor.labels
            shown = ", ".join(labels[:5]) + (", ..." if len(labels) > 5 else "")
            raise ValueError(f"class {name!r} is not one of this model's {len(labels)} classes ({shown})")
        return self.predictor.labels.index(name)

    def _run(self, image, settings):
        """The result panes as a {component: value} dict, and the settings that they show."""
        if isinstance(image, ImageRejected):  # what `UploadedImage` could not take as an upload
            raise image
        start = time.perf_counter()
        result = self.predictor.predict_checked(image, settings)  # checked in __call__ and api
        gallery = [(publish(a, self.cache_dir, f"head{k + 1}.png"), c) for k, (a, c) in enumerate(result.per_head)]
        latency_ms = (time.perf_counter() - start) * 1000
        overlay = publish(result.overlay, self.cache_dir, "overlay.png")
        facts = model_facts(self.model, latency_ms, result.ran_model)
        unlike = warning_html(result.unlike)
        view = VIEWS[result.settings.view]
        caption = caption_html(result.caption, view.method, view.legend, GRADIENT)
        p = self.page
        panes = {p.top: result.top, p.overlay: overlay, p.caption: caption, p.per_head: gallery, p.facts: facts,
                 p.unlike: unlike}
        return panes, result.settings

    def _page_outputs(self, s, sent, result=None, refused=False):
        """The page's outputs as a {component: value} dict: the result panes (`_run`'s; None: empty
        panes), and the controls set to what settings `s` show (a clamped layer, the class shown,
        the patch), enabled where they apply; a `refused` upload is taken out of the image box,
        where the browser would show it broken.

        A control whose value in `sent` (the {component: value} that the page sent) is the one shown
        gets no new value: a key or a choice made while this answer was pending then stays on the
        page, and runs next (the events' trigger_mode "always_last"), where setting the value sent
        would undo it."""
        p = self.page

        def kept(component, value):
            return component in sent and _same(sent[component], value)

        empty = {p.top: None, p.overlay: None, p.caption: "", p.per_head: [], p.facts: model_facts(self.model),
                 p.unlike: ""}
        panes, layered = result or empty, VIEWS[s.view].layered
        gallery = panes[p.per_head]
        page = panes | {
            p.per_head: gr.update(value=gallery, visible=layered and bool(gallery),
                                  label=f"Per-head maps of layer {s.layer}"),
            p.head: gr.update(interactive=layered),
            p.controls_note: VIEWS[s.view].controls_note(maps=layered and bool(gallery)),
        }
        shown = {p.view: s.view, p.class_name: None if s.class_index is None else self.predictor.labels[s.class_index],
                 p.opacity: s.opacity, p.patch: s.patch}
        page |= {c: gr.update() if kept(c, value) else value for c, value in shown.items()}
        page[p.layer] = gr.update(interactive=layered, **({} if kept(p.layer, s.layer) else {"value": s.layer}))
        return page | ({p.image: None} if refused else {})

    def _log_refusal(self, error, what="an upload"):
        """The one server log line of input refused on purpose (an upload, or an API value)."""
        print(f"{self.title}: refused {what}: {error}", file=sys.stderr, flush=True)


def _same(sent, shown):
    """Whether a control's value as the page sent it (a list for a tuple, a float for an int) is `shown`."""
    if isinstance(sent, (list, tuple)) and isinstance(shown, (list, tuple)):
        return len(sent) == len(shown) and all(_same(a, b) for a, b in zip(sent, shown))
    return (type(sent) is type(shown) or {type(sent), type(shown)} <= {int, float}) and sent == shown
