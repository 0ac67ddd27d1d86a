// The page's script, in its head (apps.page.HEAD).
// 1. Gradio's gallery marks its images loading="lazy"; far down a narrow page (one column)
//    Chromium then leaves them unloaded, and the gallery shows captions without images. They are
//    small, so load them at once.
// 2. A slider's number box applies a typed value on blur only (Gradio 6.31); Enter blurs it, so
//    Enter applies as Tab does. A box left empty (not a number) or unchanged sends nothing: its
//    blur is stopped before Gradio sees it, and an empty box gets its value back. A click into the
//    box sends nothing either (Gradio applies the value on its pointerup). A half-typed number
//    ("1e") is kept from Gradio, which would empty the box under the typing.
// 3. Gradio 6.31's JS client reads server-sent events through a fetch-based stand-in for
//    EventSource (readable_stream in @gradio/client's utils/stream.ts, `Ot` in the bundle) whose
//    close() only calls console.warn("Method not implemented."). The upload's progress bar
//    (UploadProgress.svelte) closes its /upload_progress stream when the server says "done" and
//    again when the bar goes away, so each upload logged the line twice. The server ends that
//    stream after "done" itself, so the close has nothing to do: that one message, alone, is
//    dropped; every other warning and error still shows.
// 4. A new image closes the toasts left by the one before (a refused file), so that none lies over
//    its result: the image's change handler (apps.page.CLEAR_WITH_IMAGE) calls this. Each toast is
//    also hidden at once: Gradio removes a closed toast after its fade-out, which a busy machine's
//    browser can leave unfinished until after the new result shows.
window.closeToasts = () => document.querySelectorAll(".toast-wrap .toast-close").forEach((b) => {
  b.click();
  const toast = b.closest('[data-testid="toast-body"]');
  if (toast) toast.style.display = "none";
});
const consoleWarn = console.warn;
console.warn = function (...args) {
  if (args.length === 1 && args[0] === "Method not implemented.") return;
  consoleWarn.apply(this, args);
};
new MutationObserver(() => {
  document.querySelectorAll('#heads img[loading="lazy"]').forEach((img) => { img.loading = "eager"; });
}).observe(document.documentElement, {subtree: true, childList: true});
const numberBox = (el) => el instanceof HTMLInputElement && el.type === "number" && el.closest(".clamped");
document.addEventListener("focusin", (e) => {
  if (numberBox(e.target)) e.target.dataset.shown = e.target.value;
}, true);
// A half-typed number ("1e" of "1e1") reads as empty; Gradio would empty the box, and the rest of
// the number would be typed into an empty box. Gradio sees the box again once it holds a number.
document.addEventListener("input", (e) => {
  if (numberBox(e.target) && e.target.validity.badInput) e.stopImmediatePropagation();
}, true);
// Gradio also applies the value when the box is clicked (pointerup), which sends a request for nothing.
document.addEventListener("pointerup", (e) => { if (numberBox(e.target)) e.stopImmediatePropagation(); }, true);
document.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && numberBox(e.target)) { e.preventDefault(); e.target.blur(); }
  // Enter on a dropdown's highlighted option picks it as a click does, so that the keyboard sends
  // the one `select` event that the page listens to (Gradio's own Enter sends `input` only).
  const active = e.key === "Enter" && dropdownBox(e.target)
    && document.querySelector('[role="listbox"] li.item.active');
  if (active) {
    e.preventDefault(); e.stopImmediatePropagation();
    active.dispatchEvent(new MouseEvent("mousedown", {bubbles: true, cancelable: true}));
  }
}, true);
// A slider moved by the keyboard applies its value as a drag's release does (Gradio sends on
// pointerup only): one request per key press, however long the key is held.
const rangeOf = (el) => el instanceof HTMLInputElement && el.type === "range" && el.closest(".clamped");
const SLIDER_KEYS = ["ArrowLeft", "ArrowRight", "ArrowUp", "ArrowDown", "PageUp", "PageDown", "Home", "End"];
document.addEventListener("keyup", (e) => {
  if (rangeOf(e.target) && SLIDER_KEYS.includes(e.key)) {
    e.target.dispatchEvent(new PointerEvent("pointerup", {bubbles: true}));
  }
}, true);
// A dropdown's text is selected when it gets the focus, so that typing replaces it.
const dropdownBox = (el) => el instanceof HTMLInputElement && el.closest("#class-name, #head");
const closeList = (box) => box.dispatchEvent(new KeyboardEvent("keydown", {key: "Escape", bubbles: true}));
document.addEventListener("focusin", (e) => { if (dropdownBox(e.target)) e.target.select(); }, true);
// Leaving a dropdown (Tab) closes its list, which Gradio leaves open after a text it does not know;
// after Gradio's own handling of the blur.
document.addEventListener("focusout", (e) => {
  if (dropdownBox(e.target)) setTimeout(() => { if (document.activeElement !== e.target) closeList(e.target); }, 50);
}, true);
// A click elsewhere closes a list left open.
document.addEventListener("pointerdown", (e) => {
  document.querySelectorAll("#class-name input, #head input").forEach((box) => {
    if (!box.closest(".block").contains(e.target) && !e.target.closest('[role="listbox"]')) closeList(box);
  });
}, true);
document.addEventListener("blur", (e) => {
  const box = e.target;
  if (!numberBox(box)) return;
  const shown = box.dataset.shown;
  if (box.value === "" || box.validity.badInput) {
    box.value = shown;
    box.dispatchEvent(new Event("input", {bubbles: true}));
  }
  if (box.value === shown) e.stopImmediatePropagation();
}, true);
