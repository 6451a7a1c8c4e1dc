"""A campaign from plan to results: decide what runs (``submit``: new points, retries, adaptive repeats, a
search's rungs), write its manifest, hand it to an executor (``executors``), wait, show, cancel and retry it
(``wait``, ``control``), and take the next step of its repeats or search once runs end (``nextruns``)."""
