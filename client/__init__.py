"""What a client of Junction's services needs, and nothing of the services themselves: the REST
client of the control plane (`rest`) and of the router (`router`), the bodies they answer with
as typed structs (`types`, one per response model of the API), the settings a client reads
(where the control plane is, the token it sends: `settings`), how a bad setting is reported
(`settings_errors`), and the pins and what-if CLIs (`pins_cli`, `whatif_cli`). It sits just
above the engine's core: the engine's faces (`junction serve`, `junction attach`) read its
settings, and the dashboard imports nothing of the project but this package."""
