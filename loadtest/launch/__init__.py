"""One run from the driver machine: the pre-flight, the idle memory read before it, the Locust master and
local workers as processes (and Debian's haproxy, the gateway), and the report rendered: the function every
command calls."""
