// After the token's exchange for the cookie: on to the page, in place of the tokened address.
"use strict";
location.replace(document.getElementById("next").href);
