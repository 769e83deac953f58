"""The dataset builders, which generate or render images into the cache; ``export`` and ``serve`` never import them."""
