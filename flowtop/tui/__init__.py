"""The Textual UI: the app, its screens and widgets, and the stylesheet. Renders snapshots
from flowtop.monitor; opens no socket and imports nothing from flowtop.export."""
