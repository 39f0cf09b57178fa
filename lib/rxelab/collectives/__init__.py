"""The algorithms, one module each: a function that runs a call (Call -> None). Which
collective they serve, under which name, is said by the collectives' descriptions
(rxelab.ops), which name each function as "module:function"."""
