// The console's only script: tree search and expand/collapse, and confirmations. Every page also
// works without it (the tree is made of <details> elements).
(function () {
  "use strict";
  const tree = document.getElementById("tree");
  if (tree) {
    const search = document.getElementById("tree-search");
    const noMatch = document.getElementById("no-match");
    const items = Array.from(tree.querySelectorAll("li.node"));
    const setAll = (open) => tree.querySelectorAll("details").forEach((d) => { d.open = open; });
    document.getElementById("expand-all").addEventListener("click", () => setAll(true));
    document.getElementById("collapse-all").addEventListener("click", () => setAll(false));
    const filter = () => {
      const q = search.value.trim().toLowerCase();
      let shown = 0;
      items.forEach((li) => { li.classList.remove("hidden", "match"); });
      if (!q) { noMatch.hidden = true; return; }
      // A node stays visible when it or a descendant matches; the ancestors of a match open.
      const keep = new Set();
      items.forEach((li) => {
        const hit = li.dataset.name.includes(q) || li.dataset.path.toLowerCase().includes(q);
        if (!hit) return;
        li.classList.add("match");
        shown++;
        for (let p = li; p && p !== tree; p = p.parentElement) {
          if (p.matches("li.node")) keep.add(p);
          if (p.tagName === "DETAILS" && p !== li.firstElementChild) p.open = true;
        }
      });
      items.forEach((li) => { if (!keep.has(li)) li.classList.add("hidden"); });
      noMatch.hidden = shown > 0;
    };
    search.addEventListener("input", filter);
    const initial = new URLSearchParams(location.search).get("q");
    if (initial) { search.value = initial; filter(); }
  }
  document.querySelectorAll("form[data-confirm]").forEach((form) => {
    form.addEventListener("submit", (ev) => { if (!confirm(form.dataset.confirm)) ev.preventDefault(); });
  });
})();
