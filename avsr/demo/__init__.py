"""``avsr demo``: a local web page (and a JSON endpoint) for trying a model on your own audio and video.

* :mod:`avsr.demo.app`: the FastAPI application (:func:`avsr.demo.app.create_app`), its routes and errors;
* :mod:`avsr.demo.service`: what a request does, apart from HTTP: the modalities an upload allows, the
  transcripts from :class:`avsr.Transcriber`, the fusion's gates and view weights;
* :mod:`avsr.demo.uploads`: multipart uploads streamed into a temporary folder, with a size limit;
* :mod:`avsr.demo.preview`: the mouth-ROI track as a PNG strip and an animated GIF;
* ``avsr/demo/static/``: the page (HTML, CSS, JavaScript; no build step).

The command line is :mod:`avsr.bin.demo`. FastAPI, uvicorn and python-multipart are the ``[demo]`` extra
(``pip install 'avsr[demo]'``); this package imports none of them, its modules do.
"""
