//! The node's broker state: its vhosts and users.

use crate::users::{Permissions, Users};
use crate::vhost::VHost;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

pub type SharedVHost = Arc<Mutex<VHost>>;

pub struct Broker {
    vhosts: RwLock<HashMap<String, SharedVHost>>,
    pub users: RwLock<Users>,
    epoch: Instant,
}

impl Default for Broker {
    fn default() -> Self {
        Self::new()
    }
}

impl Broker {
    /// A broker with RabbitMQ's defaults: vhost "/" and user guest/guest with all permissions.
    pub fn new() -> Self {
        let b = Broker {
            vhosts: RwLock::new(HashMap::new()),
            users: RwLock::new(Users::default()),
            epoch: Instant::now(),
        };
        b.add_vhost("/");
        {
            let mut users = b.users.write().expect("users lock");
            users.add_user("guest", "guest", vec!["administrator".into()]);
            users.set_permissions("guest", "/", Permissions::all());
        }
        b
    }

    /// Milliseconds since the broker started: the clock every queue's TTL uses.
    pub fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    pub fn add_vhost(&self, name: &str) -> bool {
        let mut v = self.vhosts.write().expect("vhosts lock");
        if v.contains_key(name) {
            return false;
        }
        v.insert(name.to_string(), Arc::new(Mutex::new(VHost::new(name))));
        true
    }

    pub fn delete_vhost(&self, name: &str) -> bool {
        self.vhosts
            .write()
            .expect("vhosts lock")
            .remove(name)
            .is_some()
    }

    pub fn vhost(&self, name: &str) -> Option<SharedVHost> {
        self.vhosts.read().expect("vhosts lock").get(name).cloned()
    }

    pub fn vhosts(&self) -> Vec<(String, SharedVHost)> {
        self.vhosts
            .read()
            .expect("vhosts lock")
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Runs time-driven work (TTL expiry, x-expires) in every vhost.
    pub fn tick(&self) {
        let now = self.now_ms();
        for (_, v) in self.vhosts() {
            v.lock().expect("vhost lock").tick(now);
        }
    }
}
